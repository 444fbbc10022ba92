package kube

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpumem/gpumem/internal/netns"
	"github.com/gpumem/gpumem/internal/syncutil"
	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// The pod's user: not root, not the daemon's; its files are 0600.
const podUser = 61000

// TestPodKernels plays `mode: notebooks` on one node, with everything real
// but the cluster and the GPU. The "pod" is what the kubelet makes of one:
// its own network namespace (only its loopback up) and mount namespace (its
// runtime dir is a tmpfs that no other namespace sees), a cgroup laid out
// as the cgroupfs driver lays out a pod's, and a user of its own. In it a
// Jupyter server starts a kernel for a notebook; the kernel starts three
// GPU workers in sessions of their own. The test then moves one worker into
// another pod's cgroup and one out of every pod. The image's `gpumem serve
// --pod-kernels --kubernetes` runs as root with exactly the capabilities the
// chart's notebooks mode grants, against a TLS server answering as the API
// server. It must find the kernel (its file only through the kernel's root,
// its ports only in the pod's namespace), name its notebook from the pod's
// server and its pod from the API, inject the magics and run a free in it,
// and, when the kernel is killed, end only the worker still in the kernel's
// pod.
func TestPodKernels(t *testing.T) {
	testenv.RequireRoot(t, "network and mount namespaces, cgroups and setns need root")
	for _, tool := range []string{"unshare", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s (util-linux) is needed to play a pod: %v", tool, err)
		}
	}
	testenv.Require(t, "ipykernel", "jupyter_client", "jupyter_server")
	// The image's binary: built with -tags kubernetes, as the DaemonSet
	// runs it.
	bin := filepath.Join(imageRootfs(t), "usr", "local", "bin", "gpumem")
	caps := chartCapabilities(t)

	podA, podB := newUID(t), newUID(t)
	containerA, containerB := randomHex(t, 32), randomHex(t, 32)
	cgA := testCgroup(t, filepath.Join("/kubepods", "besteffort", "pod"+podA, containerA))
	cgB := testCgroup(t, filepath.Join("/kubepods", "besteffort", "pod"+podB, containerB))
	cgHost := testCgroup(t, "/gpumem-test-host-"+randomHex(t, 4))

	// The pod's dir exists on the host but stays empty there: the pod
	// mounts its own tmpfs on it.
	top := t.TempDir()
	podDir := filepath.Join(top, "pod")
	if err := os.Mkdir(podDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(top), top} {
		if err := os.Chmod(d, 0o755); err != nil { // the pod's user walks through
			t.Fatal(err)
		}
	}
	token := testenv.RandomHex(16)
	// The pod's server listens on a port that, on the host's loopback, is
	// this test's: whoever reaches the server went through the pod's
	// network namespace.
	serverPort := testenv.ServeLoopback(t, func(net.Conn) {})
	// Each kernel starts three GPU workers, in sessions of their own as
	// pools and inference servers do: a restart's SIGKILL to the kernel's
	// process group misses them.
	kernelConfig := `c.IPKernelApp.exec_lines = ["import subprocess as _sp; _gpumem_workers = [_sp.Popen(['sleep', str(n)], start_new_session=True, stdin=_sp.DEVNULL, stdout=_sp.DEVNULL, stderr=_sp.DEVNULL) for n in (3601, 3602, 3603)]"]`
	script := `set -e
read _ready
"$PYTHON" -c "$LOOPBACK_UP"
mount -t tmpfs -o mode=0755 tmpfs "$POD_DIR"
mkdir -p "$POD_DIR/runtime" "$POD_DIR/notebooks/work" "$POD_DIR/ipython/profile_default"
printf '%s\n' "$KERNEL_CONFIG" > "$POD_DIR/ipython/profile_default/ipython_kernel_config.py"
chown -R "$POD_USER:$POD_USER" "$POD_DIR"
chmod 0700 "$POD_DIR/runtime"
export HOME="$POD_DIR" JUPYTER_RUNTIME_DIR="$POD_DIR/runtime" IPYTHONDIR="$POD_DIR/ipython" JUPYTER_CONFIG_DIR="$POD_DIR/config" JUPYTER_DATA_DIR="$POD_DIR/data"
exec setpriv --reuid="$POD_USER" --regid="$POD_USER" --clear-groups -- "$PYTHON" -m jupyter_server --no-browser \
  --ServerApp.ip=127.0.0.1 --ServerApp.port="$SERVER_PORT" --ServerApp.port_retries=0 \
  --ServerApp.token="$TOKEN" --ServerApp.root_dir="$POD_DIR/notebooks" --ServerApp.open_browser=False \
  --Gpumem.autostart=False`
	pod := exec.Command("unshare", "--net", "--mount", "--propagation", "private", "--fork", "--", "sh", "-c", script)
	// The pod's loopback comes up as CNI's loopback plugin brings it up
	// (SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP), without iproute2.
	loopbackUp := `import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s.fileno(), 0x8913, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH", b"lo", flags | 1))`
	pod.Env = append(os.Environ(), "LOOPBACK_UP="+loopbackUp, "POD_DIR="+podDir, "PYTHON="+testenv.Python(), "TOKEN="+token,
		"SERVER_PORT="+strconv.Itoa(serverPort), "POD_USER="+strconv.Itoa(podUser), "KERNEL_CONFIG="+kernelConfig)
	var podLog syncutil.Buffer
	pod.Stdout, pod.Stderr = &podLog, &podLog
	// Wait returns even while a process the pod left behind holds its
	// output open (the cgroups' cleanup ends them after).
	pod.WaitDelay = 10 * time.Second
	ready, err := pod.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := pod.Start(); err != nil {
		t.Fatal(err)
	}
	podExited := make(chan struct{})
	go func() { _ = pod.Wait(); close(podExited) }()
	// The pod's processes are ended by their cgroups' cleanup; then unshare.
	t.Cleanup(func() {
		_ = pod.Process.Kill()
		<-podExited
	})
	// The pod's first process joins the pod's cgroup before it starts
	// anything: everything it starts is born there, as in a container.
	serverPID := childOf(t, pod.Process.Pid, podExited)
	moveToCgroup(t, cgA, serverPID)
	if _, err := io.WriteString(ready, "go\n"); err != nil {
		t.Fatal(err)
	}

	// The server answers inside the pod's network namespace only.
	podClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.Dial(ctx, fmt.Sprintf("/proc/%d/ns/net", serverPID), network, addr)
		},
	}}
	serverURL := fmt.Sprintf("http://127.0.0.1:%d/", serverPort)
	podAPI := func(method, path string, body, out any) error {
		req, err := testenv.JSONRequest(method, serverURL+path, token, body)
		if err != nil {
			return err
		}
		resp, err := podClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s %s: %s %s", method, path, resp.Status, data)
		}
		if out != nil {
			return json.Unmarshal(data, out)
		}
		return nil
	}
	testenv.Poll(t, 90*time.Second, "the pod's Jupyter server to answer in the pod's network namespace", func() bool {
		select {
		case <-podExited:
			t.Fatalf("the pod exited:\n%s", podLog.String())
		default:
		}
		return podAPI(http.MethodGet, "api/status", nil, nil) == nil
	})

	var session struct {
		Kernel struct {
			ID string `json:"id"`
		} `json:"kernel"`
	}
	if err := podAPI(http.MethodPost, "api/sessions", map[string]any{"path": "work/train.ipynb", "name": "train.ipynb",
		"type": "notebook", "kernel": map[string]any{"name": "python3"}}, &session); err != nil {
		t.Fatalf("creating the notebook's session: %v\n%s", err, podLog.String())
	}
	kernelID := session.Kernel.ID
	connName := "kernel-" + kernelID + ".json"
	notebook := filepath.Join(podDir, "notebooks", "work", "train.ipynb")
	var kernelPID int
	var workers map[string]int
	testenv.Poll(t, 60*time.Second, "the kernel and its three workers", func() bool {
		pids := testenv.ProcessesWithArg(func(argv []string) bool {
			return slices.ContainsFunc(argv, func(a string) bool { return strings.HasSuffix(a, "/"+connName) })
		})
		if len(pids) != 1 {
			return false
		}
		kernelPID = pids[0]
		workers = childrenByArgv(kernelPID)
		// By their own argv: a child between its fork and its exec still
		// shows the kernel's, and three children are not yet the three
		// sleeps.
		return workers["3601"] > 0 && workers["3602"] > 0 && workers["3603"] > 0
	})
	if _, err := os.Stat(filepath.Join(podDir, "runtime", connName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the kernel's connection file is visible outside the pod (stat: %v): the pod's mounts are not its own", err)
	}
	kernel := testenv.Pin(t, kernelPID) // the pod server's child, not the test's
	inPod, inPodB, outside := workers["3601"], workers["3602"], workers["3603"]
	moveToCgroup(t, cgB, inPodB)
	moveToCgroup(t, cgHost, outside)

	// This node's pods, as the API server lists them.
	const node, saToken = "gpu-1", "service-account-token"
	podObject := func(name, user, uid, container string) corev1.Pod {
		return corev1.Pod{
			TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "jhub", UID: types.UID(uid), ResourceVersion: "7",
				Labels: map[string]string{"hub.jupyter.org/username": user}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "notebook", Image: "jupyter/base-notebook"}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
				{Name: "notebook", ContainerID: "containerd://" + container}}},
		}
	}
	apiSrv := startAPIServer(t, saToken, node, podObject("jupyter-alice", "alice", podA, containerA),
		podObject("jupyter-bob", "bob", podB, containerB))

	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: kernelPID, UsedBytes: 1 << 30}, testenv.FakeProc{PID: inPod, UsedBytes: 2 << 30},
		testenv.FakeProc{PID: inPodB, UsedBytes: 3 << 30}, testenv.FakeProc{PID: outside, UsedBytes: 4 << 30})
	daemonDir := t.TempDir()
	d := testenv.StartDaemon(t, asDaemonSet(t, bin, caps, apiSrv.srv, saToken), daemonDir, gpu, "--pod-kernels",
		"--kubernetes", "--node-name="+node, "--interval=200ms", "--rescan=300ms", "--reclaim-all-users", "--reclaim-grace=1s")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kernelStatus := func() (api.KernelStatus, bool) {
		ks, err := d.Client.Kernels(ctx)
		if err != nil {
			return api.KernelStatus{}, false
		}
		for _, k := range ks {
			if k.KernelID == kernelID {
				return k, true
			}
		}
		return api.KernelStatus{}, false
	}
	testenv.Poll(t, 60*time.Second, "the daemon to attach to the pod's kernel, named after its notebook", func() bool {
		k, ok := kernelStatus()
		return ok && k.Alive && k.PID == kernelPID && k.Notebook == notebook
	})
	k, _ := kernelStatus()
	if !strings.HasPrefix(k.ConnectionFile, "pod:"+podA+"/"+containerA[:12]+":") || !strings.HasSuffix(k.ConnectionFile, connName) {
		t.Errorf("connection file %q does not name the kernel's pod, container and file", k.ConnectionFile)
	}
	if k.ServerURL != serverURL {
		t.Errorf("server %q, want the pod's %q", k.ServerURL, serverURL)
	}

	// Magics injected, and code run in the kernel through the pod's
	// network namespace: a free answers with the kernel's own report.
	d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": kernelID})
	freed, err := d.Client.Free(ctx, kernelID, api.FreeRequest{})
	if err != nil {
		t.Fatalf("free in the pod's kernel: %v", err)
	}
	if !json.Valid(freed) || len(freed) < 3 {
		t.Errorf("free in the pod's kernel answered %s", freed)
	}

	// The kernel's tree, workers included wherever their cgroup now is,
	// is the notebook's: recorded before the kernel dies.
	want := []int{kernelPID, inPod, inPodB, outside}
	slices.Sort(want)
	var nb attribution.Notebook
	testenv.Poll(t, 30*time.Second, "the notebook's processes in the report", func() bool {
		rep, err := d.Client.Notebooks(ctx)
		if err != nil {
			return false
		}
		for _, n := range rep.Notebooks {
			if n.KernelID == kernelID {
				nb = n
				got := slices.Clone(n.PIDs)
				slices.Sort(got)
				return slices.Equal(got, want)
			}
		}
		return false
	})
	if nb.Notebook != notebook || nb.GPUMemoryBytes != 10<<30 {
		t.Errorf("notebook %q holds %d bytes, want %q with %d", nb.Notebook, nb.GPUMemoryBytes, notebook, uint64(10<<30))
	}
	// Its pod, from the kernel's cgroup and the API's pods of the node.
	if nb.Pod == nil || nb.Pod.Name != "jupyter-alice" || nb.Pod.Namespace != "jhub" || nb.Pod.UID != podA ||
		nb.Pod.User != "alice" || nb.Pod.Container != "notebook" {
		t.Errorf("notebook's pod %+v, want jhub/jupyter-alice (alice, container notebook)", nb.Pod)
	}

	// The kernel dies; its server starts another. Only the worker still in
	// the kernel's pod is ended.
	if !kernel.Signal(syscall.SIGKILL) {
		t.Fatalf("the pod's kernel (pid %d) had ended before the test killed it", kernelPID)
	}
	// A restart, not a shutdown: the restarted kernel's process names the
	// same file while it starts, before it listens.
	d.WaitLog(t, 30*time.Second, "orphan ended", map[string]any{"pid": inPod, "kernel_id": kernelID, "after": "restart"})
	left := map[int]string{inPodB: "not the kernel's pod " + podA, outside: "outside any pod"}
	for pid, reason := range left {
		d.WaitLog(t, 30*time.Second, "orphan holds GPU memory; left alone", map[string]any{"pid": pid, "reason": "~" + reason})
	}
	testenv.Poll(t, 10*time.Second, "the pod's orphan to be gone", func() bool { return !testenv.Alive(inPod) })
	for pid := range left {
		if !testenv.Alive(pid) {
			t.Errorf("pid %d, outside the kernel's pod, was ended", pid)
		}
	}
	if _, ok := d.FindLog("ending orphan that holds GPU memory (SIGTERM)", map[string]any{"pid": inPodB}); ok {
		t.Errorf("the daemon tried to end pid %d, in another pod", inPodB)
	}
	if _, ok := d.FindLog("ending orphan that holds GPU memory (SIGTERM)", map[string]any{"pid": outside}); ok {
		t.Errorf("the daemon tried to end pid %d, outside any pod", outside)
	}

	// The restarted kernel (same file, new process) is proven and
	// attached again, through its own root and namespace.
	testenv.Poll(t, 60*time.Second, "the daemon to follow the restarted kernel", func() bool {
		k, ok := kernelStatus()
		return ok && k.Alive && k.PID != kernelPID && k.PID != 0
	})
	for _, secret := range []string{token} {
		if strings.Contains(d.Output(), secret) {
			t.Error("the daemon logged the pod's server token")
		}
	}
	apiSrv.check(t)
}

// childrenByArgv maps the last argument of each child of pid to its pid.
func childrenByArgv(pid int) map[string]int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for _, f := range strings.Fields(string(data)) {
		child, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", child))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(argv), "\x00"), "\x00")
		out[args[len(args)-1]] = child
	}
	return out
}

// testCgroup creates the cgroup rel in the cgroup v1 pids hierarchy (or
// cgroup v2) and returns its dir. At cleanup every process in it is killed
// (all are the test's: it made the cgroup) and it is removed, with its
// parents when no other test uses them.
func testCgroup(t *testing.T, rel string) string {
	t.Helper()
	base := cgroupBase(t)
	dir := filepath.Join(base, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating a cgroup: %v", err)
	}
	for d := base; d != dir; {
		d = filepath.Join(d, strings.Split(strings.TrimPrefix(dir, d+"/"), "/")[0])
		testenv.RemoveAfterRun(d) // if the test binary is killed first
	}
	t.Cleanup(func() {
		// Through pidfds, each process checked to be in the cgroup still:
		// a pid read here may be another process's by the time it is
		// signalled.
		inCgroup := func(pid int) bool {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			return err == nil && strings.Contains(string(data), ":"+rel+"\n")
		}
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			if err != nil || len(strings.Fields(string(data))) == 0 {
				break
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					testenv.KillIf(pid, inCgroup)
				}
			}
		}
		for d := dir; d != base; d = filepath.Dir(d) {
			for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				err := os.Remove(d)
				if err == nil || !errors.Is(err, syscall.EBUSY) || time.Now().After(end) {
					break
				}
			}
		}
	})
	return dir
}

func moveToCgroup(t *testing.T, dir string, pid int) {
	t.Helper()
	// Writing 0 to cgroup.procs moves the writer: this test binary would
	// join the cgroup, and the cgroup's cleanup would SIGKILL it.
	if pid <= 0 {
		t.Fatalf("moving pid %d into %s: not a process", pid, dir)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("moving pid %d into %s: %v", pid, dir, err)
	}
}

// chartCapabilities are the capabilities the chart's notebooks mode adds.
func chartCapabilities(t *testing.T) []string {
	t.Helper()
	ds := collect(t, decodeAll(t, render(t, "--set", "mode=notebooks"))).ds
	sc := ds.Spec.Template.Spec.Containers[0].SecurityContext
	if sc == nil || sc.Capabilities == nil || len(sc.Capabilities.Add) == 0 {
		t.Fatal("the chart's notebooks mode adds no capability")
	}
	var caps []string
	for _, c := range sc.Capabilities.Add {
		caps = append(caps, strings.ToLower(string(c)))
	}
	return caps
}

// asDaemonSet writes a wrapper that runs bin as the chart's notebooks mode
// runs it, but for the pid namespace (the host's, as hostPID gives): as
// root holding only caps (bounding and inheritable sets cut down: what the
// container runtime gives a root container that drops ALL and adds caps),
// with a service account where the kubelet mounts it (in a mount namespace
// of its own, on a tmpfs over /run) and the API server in its environment.
func asDaemonSet(t *testing.T, bin string, caps []string, api *httptest.Server, token string) string {
	t.Helper()
	dir := t.TempDir()
	sa := filepath.Join(dir, "serviceaccount")
	if err := os.Mkdir(sa, 0o755); err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})
	for name, content := range map[string][]byte{"token": []byte(token), "ca.crt": ca, "namespace": []byte("gpumem")} {
		if err := os.WriteFile(filepath.Join(sa, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(api.URL, "https://"), ":")
	inner := fmt.Sprintf(`set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
cp %[1]s/* /run/secrets/kubernetes.io/serviceaccount/
export KUBERNETES_SERVICE_HOST=%[2]s KUBERNETES_SERVICE_PORT=%[3]s
exec setpriv --inh-caps=-all --bounding-set=-all,+%[4]s -- %[5]s "$@"`, sa, host, port, strings.Join(caps, ",+"), bin)
	wrapper := filepath.Join(dir, "gpumem-daemonset")
	script := fmt.Sprintf("#!/bin/sh\nexec unshare --mount --propagation private -- sh -c '%s' sh \"$@\"\n", inner)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper
}
