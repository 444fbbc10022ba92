package discovery

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/sidecar/procs"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

func TestPodKey(t *testing.T) {
	p := PodKernel{UID: "7c9e6679-7425-40de-944b-e07fc1f90ae7", ContainerID: strings.Repeat("ab", 32), Path: "/home/jovyan/kernel-1.json"}
	if got, want := podKey(p), "pod:7c9e6679-7425-40de-944b-e07fc1f90ae7/abababababab:/home/jovyan/kernel-1.json"; got != want {
		t.Errorf("podKey = %q, want %q", got, want)
	}
	p.ContainerID = ""
	if got := podKey(p); got != "pod:7c9e6679-7425-40de-944b-e07fc1f90ae7/:/home/jovyan/kernel-1.json" {
		t.Errorf("podKey without a container = %q", got)
	}
}

// TestPodFinderProof runs PodFinder over a fixture /proc whose processes
// have roots (containers' file trees) and network namespaces of their own.
// Only the kernel that owns its shell port in its own namespace, runs as
// its file's owner and reads its file inside its own root is found.
func TestPodFinderProof(t *testing.T) {
	const podA, podB = "0aa00000-0000-4000-8000-00000000000a", "0bb00000-0000-4000-8000-00000000000b"
	cA, cB := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	uid := uint32(os.Getuid())
	top := t.TempDir()
	root := filepath.Join(top, "proc")
	hostDir := filepath.Join(top, "host") // the daemon's own files
	rootA, rootB := filepath.Join(top, "containerA"), filepath.Join(top, "containerB")
	const rt = "/home/jovyan/.local/share/jupyter/runtime"
	connFile := func(port int) string {
		return fmt.Sprintf(`{"shell_port": %d, "iopub_port": %d, "stdin_port": %d, "control_port": %d, "hb_port": %d,
 "ip": "127.0.0.1", "key": "k", "transport": "tcp", "signature_scheme": "hmac-sha256", "kernel_name": "python3"}`,
			port, port+1, port+2, port+3, port+4)
	}
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(rootA, rt, "kernel-good.json"), connFile(52001))
	write(filepath.Join(rootA, rt, "kernel-hostnet.json"), connFile(52002))
	write(filepath.Join(rootB, rt, "kernel-foreign.json"), connFile(52005))
	// The daemon's own file, which a symlink in container B names by its
	// absolute path: read inside B's root, it does not exist.
	write(filepath.Join(hostDir, "kernel-host.json"), connFile(52004))
	if err := os.Symlink(filepath.Join(hostDir, "kernel-host.json"), filepath.Join(rootB, rt, "kernel-escape.json")); err != nil {
		t.Fatal(err)
	}

	launch := func(file string) []string { return []string{"python3", "-m", "ipykernel_launcher", "-f", file} }
	procstest.WriteTree(t, root, []procstest.Proc{
		{PID: 1, PGID: 1, SID: 1, Start: 1, Comm: "init"},
		{PID: 100, PPID: 1, PGID: 100, SID: 100, Start: 2, UID: uid, Argv: []string{"python3", "-m", "jupyter_server"}},
		{PID: 1000, PPID: 100, PGID: 1000, SID: 1000, Start: 5, UID: uid, Argv: launch(rt + "/kernel-good.json"),
			Sockets: []uint64{41001}, Env: []string{"JPY_SESSION_NAME=/home/jovyan/work/train.ipynb"}},
		{PID: 2000, PPID: 100, PGID: 2000, SID: 2000, Start: 6, UID: uid, Argv: launch(rt + "/kernel-hostnet.json"), Sockets: []uint64{41002}},
		{PID: 3000, PPID: 1, PGID: 3000, SID: 3000, Start: 7, UID: uid, Argv: launch(filepath.Join(hostDir, "kernel-host.json")), Sockets: []uint64{41003}},
		{PID: 4000, PPID: 1, PGID: 4000, SID: 4000, Start: 8, UID: uid, Argv: launch(rt + "/kernel-escape.json"), Sockets: []uint64{41004}},
		{PID: 5000, PPID: 1, PGID: 5000, SID: 5000, Start: 9, UID: 4242, Argv: launch(rt + "/kernel-foreign.json"), Sockets: []uint64{41005}},
	})
	cgroup := func(pod, container string) string {
		return fmt.Sprintf("0::/kubepods/besteffort/pod%s/%s\n", pod, container)
	}
	for pid, content := range map[int]string{1: "0::/init.scope\n", 100: cgroup(podA, cA), 1000: cgroup(podA, cA),
		2000: cgroup(podA, cA), 3000: "0::/user.slice/user-1000.slice/session-3.scope\n", 4000: cgroup(podB, cB), 5000: cgroup(podB, cB)} {
		write(filepath.Join(root, fmt.Sprint(pid), "cgroup"), content)
	}
	for pid, r := range map[int]string{100: rootA, 1000: rootA, 2000: rootA, 3000: "/", 4000: rootB, 5000: rootB} {
		if err := os.Symlink(r, filepath.Join(root, fmt.Sprint(pid), "root")); err != nil {
			t.Fatal(err)
		}
	}
	// Pod A's network namespace lists the good kernel's port only; the
	// host's lists the hostnet kernel's, which its own namespace does not.
	podANet := map[int]uint64{52001: 41001}
	procstest.WriteNet(t, root, map[int]uint64{52002: 41002, 52003: 41003, 52004: 41004}, nil)
	for _, pid := range []int{100, 1000, 2000} {
		procstest.WriteNet(t, filepath.Join(root, fmt.Sprint(pid)), podANet, nil)
	}
	procstest.WriteNet(t, filepath.Join(root, "3000"), map[int]uint64{52004: 41003}, nil)
	procstest.WriteNet(t, filepath.Join(root, "4000"), map[int]uint64{52004: 41004}, nil)
	procstest.WriteNet(t, filepath.Join(root, "5000"), map[int]uint64{52005: 41005}, nil)

	res := NewPodFinder(&procs.FS{Root: root}).Find(context.Background())

	if len(res.Kernels) != 1 {
		t.Fatalf("kernels %+v, want the good one only; problems %v", res.Kernels, res.Problems)
	}
	k := res.Kernels[0]
	wantKey := podKey(PodKernel{UID: podA, ContainerID: cA, Path: rt + "/kernel-good.json"})
	if k.ID != "good" || k.PID != 1000 || k.PIDStart != 5 || !k.PIDProven || k.ConnectionFile != wantKey ||
		k.Connection.ShellPort != 52001 || k.FileUID != uid {
		t.Errorf("kernel %+v", k)
	}
	if k.Pod == nil || k.Pod.UID != podA || k.Pod.ContainerID != cA || k.Pod.WitnessPID != 100 || k.Pod.WitnessStart != 2 {
		t.Errorf("pod %+v: want pod A, container A, its server (pid 100) as witness", k.Pod)
	}
	if k.Notebook != "/home/jovyan/work/train.ipynb" || k.NotebookFrom != "JPY_SESSION_NAME" {
		t.Errorf("notebook %q from %q: want the kernel's JPY_SESSION_NAME", k.Notebook, k.NotebookFrom)
	}

	wantPending := []string{
		podKey(PodKernel{UID: podA, ContainerID: cA, Path: rt + "/kernel-hostnet.json"}),
		podKey(PodKernel{UID: podB, ContainerID: cB, Path: rt + "/kernel-escape.json"}),
		podKey(PodKernel{UID: podB, ContainerID: cB, Path: rt + "/kernel-foreign.json"}),
	}
	got := slices.Clone(res.Pending)
	slices.Sort(got)
	slices.Sort(wantPending)
	if !slices.Equal(got, wantPending) {
		t.Errorf("pending %v, want %v (the host kernel, pid 3000, is no pod's)", got, wantPending)
	}
	var text []string
	for _, p := range res.Problems {
		text = append(text, p.Error())
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{
		"/proc/4000/root" + rt + "/kernel-escape.json: no such file or directory",
		"pid 5000 runs as uid 4242, but the file belongs to uid " + fmt.Sprint(uid),
	} {
		if !strings.Contains(all, want) {
			t.Errorf("problems lack %q:\n%s", want, all)
		}
	}
	// Not listening in its own namespace reads as a kernel starting:
	// pending, but no warning.
	if strings.Contains(all, "pid 2000") {
		t.Errorf("a kernel not listening yet is reported as a problem:\n%s", all)
	}
	if strings.Contains(all, "3000") {
		t.Errorf("a kernel outside every pod is reported: it is the runtime dirs' business:\n%s", all)
	}
}
