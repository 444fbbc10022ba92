package adversarial

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// listenerWithChild is a plain TCP listener (no kernel) with a child: what
// a stale connection file's port can belong to once its kernel is gone.
const listenerWithChild = `
import socket, subprocess, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = subprocess.Popen(["sleep", "600"])
print(s.getsockname()[1], c.pid, flush=True)
time.sleep(600)
`

// writeConnFile writes a connection file naming shellPort (other ports are
// unused ones) with a random key.
func writeConnFile(t *testing.T, path string, shellPort int) {
	t.Helper()
	conn := map[string]any{
		"transport": "tcp", "ip": "127.0.0.1", "shell_port": shellPort,
		"iopub_port": testenv.FreePort(t), "stdin_port": testenv.FreePort(t),
		"control_port": testenv.FreePort(t), "hb_port": testenv.FreePort(t),
		"key": testenv.RandomHex(16), "signature_scheme": "hmac-sha256", "kernel_name": "python3",
	}
	b, _ := json.Marshal(conn)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// staleSetup starts a listener with a child, both on the simulated GPU, and
// a connection file kernel-stale.json naming the listener's port.
func staleSetup(t *testing.T) (dir, file string, listener *exec.Cmd, child int, gpu *testenv.FakeGPU) {
	dir = jupyterDir(t)
	listener, nums := pyProc(t, listenerWithChild)
	port, child := nums[0], nums[1]
	killLater(t, child)
	file = filepath.Join(dir, "runtime", "kernel-stale.json")
	writeConnFile(t, file, port)
	gpu = testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: listener.Process.Pid, UsedBytes: 1 << 20}, testenv.FakeProc{PID: child, UsedBytes: 1 << 30})
	return dir, file, listener, child, gpu
}

// gpumem ls and gpumem kernels do not take a stale connection file's port
// owner for a kernel, and say why.
func TestStaleConnectionFileCLI(t *testing.T) {
	t.Parallel()
	dir, _, listener, _, gpu := staleSetup(t)
	out, errOut, err := gpumem(t, dir, gpu, "ls", "--json")
	if err != nil {
		t.Fatalf("gpumem ls: %v\n%s", err, errOut)
	}
	var rep struct {
		Notebooks []struct {
			KernelID string `json:"kernel_id"`
			PIDs     []int  `json:"pids"`
		} `json:"notebooks"`
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, out)
	}
	for _, nb := range rep.Notebooks {
		if nb.KernelID == "stale" && len(nb.PIDs) > 0 {
			t.Fatalf("gpumem ls lists pids %v under kernel-stale.json: a stale file made %d a kernel", nb.PIDs, listener.Process.Pid)
		}
	}
	if !strings.Contains(strings.Join(rep.Warnings, "\n"), "not counted as a kernel") {
		t.Errorf("ls warnings do not say the listener is not counted as a kernel: %q", rep.Warnings)
	}
	_, kerr, _ := gpumem(t, dir, nil, "kernels")
	if !strings.Contains(kerr, "kernel-stale.json") || !strings.Contains(kerr, "not counted as a kernel") {
		t.Errorf("gpumem kernels stderr does not name the stale file: %q", kerr)
	}
}

// A stale or planted connection file that names another program's port
// does not make that program a kernel: its children are neither listed
// under the notebook nor ended when it dies or the file goes.
func TestStaleConnectionFileDaemon(t *testing.T) {
	t.Parallel()
	dir, file, listener, child, gpu := staleSetup(t)
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms", "--reclaim-grace=500ms")
	listed := false
	testenv.Poll(t, 15*time.Second, "the daemon reports the child", func() bool {
		under, other := kernelHolds(d.Report(t), "stale", child)
		if under && !listed {
			listed = true
			t.Errorf("the daemon lists child %d under kernel-stale.json", child)
		}
		return other || under
	})
	// The listener dies (a restart, as far as a file-trusting daemon could
	// tell), then the file goes (a shutdown): the child stays.
	if err := listener.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = listener.Wait() // reaped: no zombie left in /proc
	// Its GPU entry goes with it: once the report drops it, the daemon has
	// sampled after the death.
	gpu.Set(t, testenv.FakeProc{PID: child, UsedBytes: 1 << 30})
	testenv.Poll(t, 15*time.Second, "the daemon sees the listener gone", func() bool {
		_, other := kernelHolds(d.Report(t), "stale", listener.Process.Pid)
		return !other
	})
	staysAlive(t, 3*time.Second, "child of a process named by a stale connection file", child)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	staysAlive(t, 3*time.Second, "child of a process named by a deleted stale connection file", child)
	if _, found := d.FindLog("ending orphan that holds GPU memory (SIGTERM)", nil); found {
		t.Fatal("the daemon tried to end an orphan of a process that was never a kernel")
	}
}

// A connection file of another user's names port of a process of ours: the
// owners differ, so it is not a kernel either. (Root makes the file
// another user's; elsewhere this needs no root: the owner check is unit
// tested in the discovery package.)
func TestConnectionFileOfAnotherUser(t *testing.T) {
	t.Parallel()
	testenv.RequireRoot(t, "needs root to chown a file to another user (CI runs as root)")
	dir := jupyterDir(t)
	_, nums := pyProc(t, listenerWithChild)
	port, child := nums[0], nums[1]
	killLater(t, child)
	file := filepath.Join(dir, "runtime", "kernel-foreign.json")
	writeConnFile(t, file, port)
	if err := os.Chown(file, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, kerr, _ := gpumem(t, dir, nil, "kernels")
	if !strings.Contains(kerr, "kernel-foreign.json") || !strings.Contains(kerr, "but the file belongs to uid 65534") {
		t.Errorf("gpumem kernels stderr does not say the owners differ: %q", kerr)
	}
}
