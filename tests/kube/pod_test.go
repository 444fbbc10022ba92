package kube

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpumem/gpumem/internal/syncutil"
	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// TestImageNamesPods runs the image as the DaemonSet does, end to end but
// for the cluster: `gpumem serve --kubernetes` as nobody, in its own pid
// and mount namespaces (unshare, chroot into the image's rootfs), with the host's
// /proc at /host/proc, a service account mounted where the kubelet mounts
// it, and KUBERNETES_SERVICE_HOST/PORT naming a TLS server that answers
// the pod list and watch as an API server does. The GPU process is a real
// process that the test moves into a real cgroup laid out as the kubelet
// lays out a pod's (cgroupfs driver: kubepods/besteffort/pod<uid>/<id>), so
// the kernel itself writes the /proc/<pid>/cgroup the daemon parses. The
// pod's name, namespace, container and user must reach /metrics and the
// local API's report.
func TestImageNamesPods(t *testing.T) {
	testenv.RequireRoot(t, "unshare, chroot and creating cgroups need root")
	rootfs := imageRootfs(t)
	podUID := newUID(t)
	containerID := randomHex(t, 32)

	// A GPU process in the pod's cgroup.
	sleeper := exec.Command("sleep", "3600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	cgroupPath := podCgroup(t, podUID, containerID, sleeper.Process)
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sleeper.Process.Pid))
	if err != nil || !strings.Contains(string(data), cgroupPath) {
		t.Fatalf("the kernel's /proc/%d/cgroup does not show %s: %q %v", sleeper.Process.Pid, cgroupPath, data, err)
	}

	// The API server: this node's pods, one of them the sleeper's.
	pod := corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "jupyter-alice", Namespace: "jhub", UID: types.UID(podUID), ResourceVersion: "7",
			Labels: map[string]string{"hub.jupyter.org/username": "alice", "component": "singleuser-server"}},
		Spec: corev1.PodSpec{NodeName: "gpu-1", Containers: []corev1.Container{{Name: "notebook", Image: "jupyter/base-notebook"}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: "notebook", ContainerID: "containerd://" + containerID}}},
	}
	const token = "service-account-token"
	api := startAPIServer(t, token, "gpu-1", pod)
	const used = 5 << 30
	d := startImageDaemon(t, rootfs, api.srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.srv.Certificate().Raw}),
		token, "gpu-1", testenv.SimGPU{Name: "Simulated H200", UUID: "GPU-1", MemoryTotalBytes: 141 << 30,
			Processes: []testenv.FakeProc{{PID: sleeper.Process.Pid, UsedBytes: used}}})
	metricsPort, logs, exited := d.metricsPort, d.logs, d.exited

	want := fmt.Sprintf(`gpumem_pod_gpu_memory_bytes{container="notebook",gpu="0",kernel_id="",namespace="jhub",notebook="",pod="jupyter-alice",user="alice"} %g`, float64(used))
	client := &http.Client{Timeout: 5 * time.Second}
	var body string
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(body, want) {
		select {
		case <-exited:
			t.Fatalf("gpumem serve --kubernetes exited:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s /metrics lacks\n%s\n/metrics:\n%s\ndaemon log:\n%s", want, body, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
	}

	rep := d.ls(t, rootfs)
	if len(rep.Other) != 1 || rep.Other[0].Pod == nil || rep.Other[0].Pod.Name != "jupyter-alice" ||
		rep.Other[0].Pod.UID != podUID || rep.Other[0].Pod.User != "alice" || rep.Other[0].Pod.Container != "notebook" {
		t.Errorf("gpumem ls --json in the container, other processes: %+v (without pods it is ls's own report, not the daemon's)", rep.Other)
	}
	if !logContains(logs.String(), "watching this node's pods") {
		t.Errorf("no log of the informer's sync:\n%s", logs.String())
	}
	api.check(t)
}

// imageDaemon is the image's `gpumem serve --kubernetes` run as the
// chart's DaemonSet runs it (startImageDaemon).
type imageDaemon struct {
	metricsPort int
	logs        *syncutil.Buffer
	exited      chan struct{}
	pid         int      // the daemon, as the host sees it
	userspec    string   // the chart's runAsUser:runAsGroup
	env         []string // the container's env, as the chart renders it
	gpuFile     string
}

// startImageDaemon runs the image as the DaemonSet does, but for the
// cluster: `gpumem serve --kubernetes` as the chart's user, in its own pid
// and mount namespaces (unshare, chroot into the image's rootfs), with the
// host's /proc at /host/proc, the service account (token, ca) mounted
// where the kubelet mounts it, KUBERNETES_SERVICE_HOST/PORT naming apiURL,
// NODE_NAME node, and gpus as its simulated GPUs. It is ended at cleanup.
func startImageDaemon(t *testing.T, rootfs, apiURL string, ca []byte, token, node string, gpus ...testenv.SimGPU) *imageDaemon {
	t.Helper()
	host, port, _ := strings.Cut(strings.TrimPrefix(apiURL, "https://"), ":")

	// The service account as the kubelet mounts it: a dir of the test's,
	// bound where the kubelet mounts it inside the image (in the daemon's
	// own mount namespace: the image is shared by the package's tests).
	sa := t.TempDir()
	if err := os.Chmod(sa, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"token": []byte(token), "ca.crt": ca, "namespace": []byte("gpumem")} {
		if err := os.WriteFile(filepath.Join(sa, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	saMount := "/var/run/secrets/kubernetes.io/serviceaccount"
	if err := os.MkdirAll(filepath.Join(rootfs, saMount), 0o755); err != nil {
		t.Fatal(err)
	}
	gpuName := "gpus-" + randomHex(t, 4) + ".json"
	gpuFile := filepath.Join(rootfs, "run", gpuName)
	writeGPUs(t, gpuFile, gpus...)
	t.Cleanup(func() { os.Remove(gpuFile) })
	if err := os.MkdirAll(filepath.Join(rootfs, "host", "proc"), 0o755); err != nil {
		t.Fatal(err)
	}

	// The container as the chart renders it: its args and env, its user,
	// its emptyDirs (tmpfs, world-writable as the kubelet makes them) and
	// its read-only root. Only --listen is overridden (the last flag
	// wins), to a free loopback port.
	ds := collect(t, decodeAll(t, render(t))).ds
	podSpec := ds.Spec.Template.Spec
	c := podSpec.Containers[0]
	metricsPort := testenv.FreePort(t)
	args := append(slices.Clone(c.Args), "--listen=127.0.0.1:"+strconv.Itoa(metricsPort))
	var daemonEnv []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			daemonEnv = append(daemonEnv, e.Name+"="+node)
		case e.ValueFrom != nil:
			t.Fatalf("env %s comes from %+v: the test cannot play it", e.Name, e.ValueFrom)
		default:
			daemonEnv = append(daemonEnv, e.Name+"="+e.Value)
		}
	}
	env := append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "ROOTFS=" + rootfs,
		"KUBERNETES_SERVICE_HOST=" + host, "KUBERNETES_SERVICE_PORT=" + port,
		"SA=" + sa, "GPUMEM_PROC_ROOT=/host/proc", "GPUMEM_FAKE_GPU=/run/" + gpuName}, daemonEnv...)
	emptyDirs := map[string]bool{}
	for _, v := range podSpec.Volumes {
		if v.EmptyDir != nil {
			emptyDirs[v.Name] = true
		}
	}
	var mounts strings.Builder
	for _, m := range c.VolumeMounts {
		if !emptyDirs[m.Name] {
			t.Fatalf("volume %s is not an emptyDir: the test cannot play it", m.Name)
		}
		fmt.Fprintf(&mounts, "mount -t tmpfs -o mode=0777 tmpfs \"$ROOTFS%s\"\n", m.MountPath)
	}
	readOnly := ""
	if sc := c.SecurityContext; sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		readOnly = `mount -o remount,bind,ro "$ROOTFS"` + "\n"
	}
	psc := podSpec.SecurityContext
	if psc == nil || psc.RunAsUser == nil || psc.RunAsGroup == nil {
		t.Fatal("the chart sets no runAsUser/runAsGroup")
	}
	// A setuid away from root clears the effective capabilities, as the
	// chart's drop ALL does.
	userspec := fmt.Sprintf("%d:%d", *psc.RunAsUser, *psc.RunAsGroup)

	// The root is bound onto itself first, so that it can be made
	// read-only under the mounts made on it.
	script := "set -e\n" +
		"mount --make-rprivate /\n" +
		`mount --bind "$ROOTFS" "$ROOTFS"` + "\n" +
		`mount --rbind /proc "$ROOTFS/host/proc"` + "\n" +
		`mount -t proc proc "$ROOTFS/proc"` + "\n" +
		mounts.String() +
		`mount --bind "$SA" "$ROOTFS` + saMount + `"` + "\n" + readOnly +
		`exec chroot --userspec=` + userspec + ` "$ROOTFS" /usr/local/bin/gpumem "$@"`
	cmd := exec.Command("unshare", append([]string{"--pid", "--fork", "--kill-child", "--mount", "--", "sh", "-c", script, "sh"}, args...)...)
	cmd.Env = env
	var logs syncutil.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// The container's first process is the daemon, pid 1 of its pid
	// namespace: ending it ends the namespace. unshare's --kill-child
	// does not reach it (the setuid to nobody clears the parent-death
	// signal), so the test ends it itself.
	daemonPID := childOf(t, cmd.Process.Pid, exited)
	// Signalled through a pidfd taken while it runs: its number may be
	// another process's once it has exited.
	daemonFD, err := unix.PidfdOpen(daemonPID, 0)
	if err != nil {
		t.Fatalf("the daemon (pid %d): %v", daemonPID, err)
	}
	t.Cleanup(func() {
		defer unix.Close(daemonFD)
		_ = unix.PidfdSendSignal(daemonFD, unix.SIGTERM, nil, 0)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = unix.PidfdSendSignal(daemonFD, unix.SIGKILL, nil, 0)
			<-exited
		}
	})

	return &imageDaemon{metricsPort: metricsPort, logs: &logs, exited: exited, pid: daemonPID, userspec: userspec, env: daemonEnv, gpuFile: gpuFile}
}

// ls is what `kubectl exec ds/gpumem -- gpumem ls --json` does: a second
// process in the container's namespaces, with its env and user, reads the
// daemon's report through the socket in the emptyDir.
func (d *imageDaemon) ls(t *testing.T, rootfs string) attribution.Report {
	t.Helper()
	lsCtx, lsCancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer lsCancel()
	chroot, err := exec.LookPath("chroot")
	if err != nil {
		t.Fatal(err)
	}
	ls := exec.CommandContext(lsCtx, "nsenter", "-t", strconv.Itoa(d.pid), "-m", "-p", "--",
		chroot, "--userspec="+d.userspec, rootfs, "/usr/local/bin/gpumem", "ls", "--json")
	ls.Env = d.env
	out, err := ls.CombinedOutput()
	if err != nil {
		t.Fatalf("gpumem ls --json in the container: %v\n%s\ndaemon log:\n%s", err, out, d.logs.String())
	}
	var rep attribution.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("gpumem ls --json: %v\n%s", err, out)
	}
	return rep
}

// setGPUs replaces what the daemon's simulated GPUs show.
func (d *imageDaemon) setGPUs(t *testing.T, gpus ...testenv.SimGPU) {
	t.Helper()
	writeGPUs(t, d.gpuFile, gpus...)
}

// writeGPUs writes a simulated-GPU file the image's user can read, whole
// (renamed into place: the daemon never reads half of one).
func writeGPUs(t *testing.T, path string, gpus ...testenv.SimGPU) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, testenv.SimulatedGPUs(gpus...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// apiServer is a TLS server that answers as a Kubernetes API server does
// the daemon's list and watch of one node's pods, and records every other
// request as an error.
type apiServer struct {
	srv  *httptest.Server
	mu   sync.Mutex
	errs []string
}

func startAPIServer(t *testing.T, token, node string, pods ...corev1.Pod) *apiServer {
	t.Helper()
	a := &apiServer{}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bad := func(format string, args ...any) {
			a.mu.Lock()
			a.errs = append(a.errs, fmt.Sprintf(format, args...))
			a.mu.Unlock()
			http.Error(w, "forbidden", http.StatusForbidden)
		}
		q := r.URL.Query()
		switch {
		case r.Header.Get("Authorization") != "Bearer "+token:
			bad("request without the service account's token: %s", r.URL)
		case r.Method != http.MethodGet || r.URL.Path != "/api/v1/pods":
			bad("request outside get/list/watch pods: %s %s", r.Method, r.URL)
		case q.Get("fieldSelector") != "spec.nodeName="+node:
			bad("pods not restricted to the node: %s", r.URL)
		case q.Get("watch") == "true":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
				ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: pods})
		}
	}))
	// The daemon's watch stays open until its connection closes.
	t.Cleanup(func() { a.srv.CloseClientConnections(); a.srv.Close() })
	return a
}

// check fails t for every request the server refused.
func (a *apiServer) check(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.errs {
		t.Error(e)
	}
}

// podCgroup creates the cgroup the kubelet's cgroupfs driver gives a
// besteffort pod's container (under cgroupBase), and moves
// proc into it. At cleanup it kills proc and removes the cgroup (and its
// parents, when no other test uses them). It returns the cgroup's path.
func podCgroup(t *testing.T, podUID, containerID string, proc *os.Process) string {
	t.Helper()
	base := cgroupBase(t)
	rel := filepath.Join("/kubepods", "besteffort", "pod"+podUID, containerID)
	dir := filepath.Join(base, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating a cgroup: %v", err)
	}
	for d := base; d != dir; {
		d = filepath.Join(d, strings.Split(strings.TrimPrefix(dir, d+"/"), "/")[0])
		testenv.RemoveAfterRun(d) // if the test binary is killed first
	}
	t.Cleanup(func() {
		_ = proc.Kill()
		for d := dir; d != base; d = filepath.Dir(d) {
			// EBUSY until the killed process is gone; ENOTEMPTY (a parent
			// another test uses) leaves it.
			for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				err := os.Remove(d)
				if err == nil || !errors.Is(err, syscall.EBUSY) || time.Now().After(end) {
					break
				}
			}
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(proc.Pid)), 0o644); err != nil {
		t.Fatalf("moving pid %d into %s: %v", proc.Pid, dir, err)
	}
	return rel
}

// cgroupBase is where processes are moved to play a pod: the cgroup v1
// pids hierarchy (moving a process there changes nothing else about it) or
// cgroup v2.
func cgroupBase(t *testing.T) string {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	var base string
	sc := bufio.NewScanner(bytes.NewReader(mounts))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		if f[2] == "cgroup" && strings.Contains(","+f[3]+",", ",pids,") {
			base = f[1]
			break
		}
		if f[2] == "cgroup2" && base == "" {
			base = f[1]
		}
	}
	if base == "" {
		t.Fatal("no cgroup v1 pids hierarchy nor cgroup v2 mounted")
	}
	return base
}

func newUID(t *testing.T) string {
	h := randomHex(t, 16)
	return h[:8] + "-" + h[8:12] + "-4" + h[13:16] + "-8" + h[17:20] + "-" + h[20:]
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func logContains(logs, msg string) bool {
	for _, line := range strings.Split(logs, "\n") {
		var entry struct {
			Message string `json:"message"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Message == msg {
			return true
		}
	}
	return false
}

// childOf waits (30 s) for pid's one child (unshare --fork's child, which
// becomes the daemon) and returns it.
func childOf(t *testing.T, pid int, exited <-chan struct{}) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if fields := strings.Fields(string(data)); err == nil && len(fields) == 1 {
			child, err := strconv.Atoi(fields[0])
			if err != nil {
				t.Fatal(err)
			}
			return child
		}
		select {
		case <-exited:
			t.Fatalf("unshare (pid %d) exited before starting the daemon", pid)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("unshare (pid %d) has no single child after 30s", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
