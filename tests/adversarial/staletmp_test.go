package adversarial

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// A stale /tmp connection file that a process names with -f, whose shell
// port another process serves, is no kernel: the daemon neither follows
// it, nor attributes the port owner's processes to it, nor reclaims them
// when the port owner dies.
func TestStaleTmpConnectionFileNotFollowed(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	// The port owner, with a child: both hold GPU memory.
	owner, nums := pyProc(t, `
import socket, subprocess
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
c = subprocess.Popen(["sleep", "600"])
print(s.getsockname()[1], c.pid, flush=True)
import time
time.sleep(600)
`)
	if len(nums) != 2 {
		t.Fatalf("port owner printed %v", nums)
	}
	port, child := nums[0], nums[1]
	killLater(t, child)

	f, err := os.CreateTemp("", "tmp*.json")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(f.Name()) })
	conn, _ := json.Marshal(map[string]any{"transport": "tcp", "ip": "127.0.0.1", "shell_port": port,
		"iopub_port": testenv.FreePort(t), "stdin_port": testenv.FreePort(t), "control_port": testenv.FreePort(t),
		"hb_port": testenv.FreePort(t), "key": testenv.RandomHex(16), "signature_scheme": "hmac-sha256"})
	if _, err := f.Write(conn); err != nil {
		t.Fatal(err)
	}
	f.Close()
	id := strings.TrimSuffix(filepath.Base(f.Name()), ".json")
	// A process of this Jupyter environment that names the file as a
	// kernel's connection file, and is not the port's owner.
	namer := testenv.Start(t, testenv.Env(dir), dir, "/usr/bin/python3", "-c", "import time; time.sleep(600)", "-f", f.Name())

	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: owner.Process.Pid, UsedBytes: 1 << 30}, testenv.FakeProc{PID: child, UsedBytes: 2 << 30},
		testenv.FakeProc{PID: namer.Cmd.Process.Pid, UsedBytes: 1 << 30})
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms", "--rescan=300ms", "--reclaim-grace=500ms")

	// Many rescans: the file is looked at and refused each time.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if entry, ok := d.FindLog("attached", map[string]any{"kernel_id": id}); ok {
			t.Fatalf("the daemon follows the stale file: %v", entry)
		}
		if entry, ok := d.FindLog("kernel process", map[string]any{"kernel_id": id}); ok {
			t.Fatalf("the daemon took a process for the stale file's kernel: %v", entry)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep := d.Report(t)
	for _, nb := range rep.Notebooks {
		if nb.KernelID == id {
			t.Fatalf("the stale file is reported as a kernel: %+v", nb)
		}
	}
	for _, pid := range []int{owner.Process.Pid, child, namer.Cmd.Process.Pid} {
		if _, other := kernelHolds(rep, "", pid); !other {
			t.Errorf("pid %d is not reported among the other processes: %+v", pid, rep)
		}
	}

	// The port owner dies: its child is no kernel's orphan.
	if err := owner.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	staysAlive(t, 3*time.Second, "child of the stale file's port owner", child)
	if _, ok := d.FindLog("ending orphan that holds GPU memory (SIGTERM)", map[string]any{"pid": child}); ok {
		t.Fatal("the daemon tried to end the port owner's child")
	}
}
