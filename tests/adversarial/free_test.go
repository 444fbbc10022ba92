package adversarial

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// kernelWithMagics starts a kernel (no server) and gpumem serve beside it,
// with the kernel's process at kernelBytes on the simulated GPU, and waits
// until the magics are injected.
func kernelWithMagics(t *testing.T, kernelBytes uint64, args ...string) (dir string, k *testenv.Kernel, d *testenv.Daemon, gpu *testenv.FakeGPU) {
	t.Helper()
	dir = jupyterDir(t)
	k = testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	gpu = testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: kernelBytes})
	d = testenv.StartDaemon(t, gpumemBin, dir, gpu, args...)
	d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": k.ID})
	return dir, k, d, gpu
}

// The driver's figure that %gpumem free reports after freeing is read after
// the caches were emptied, not taken from the daemon's last sample: here
// the simulated GPU changes during the free (an object's finalizer rewrites
// it when the free deletes the object) and the daemon samples once an hour.
func TestFreeReportsTheDriverFigureNow(t *testing.T) {
	t.Parallel()
	_, k, _, gpu := kernelWithMagics(t, 4<<30, "--interval=1h")
	pid := k.Cmd.Process.Pid
	after := string(testenv.SimulatedGPUs(testenv.SimH200(0, 80<<30, testenv.FakeProc{PID: pid, UsedBytes: 1 << 30})))
	r := testenv.RunCell(t, k.ConnectionFile, fmt.Sprintf(`
import os
class _Shrinks:
    def __del__(self, path=%q, doc=%q):
        with open(path + ".new", "w") as f:
            f.write(doc)
        os.replace(path + ".new", path)
x = _Shrinks()
from IPython.utils.capture import capture_output
with capture_output() as _c:
    get_ipython().run_line_magic("gpumem", "free x")
print("\n".join(o.data.get("text/plain", "") for o in _c.outputs))
`, gpu.Path, after), 60*time.Second)
	if r.Status != "ok" {
		t.Fatalf("free cell: %+v", r)
	}
	re := regexp.MustCompile(`driver \(NVML\): (\S+ \S+) -> (\S+ \S+) for this kernel`)
	m := re.FindStringSubmatch(r.Stdout)
	if m == nil {
		t.Fatalf("the free report has no driver line:\n%s", r.Stdout)
	}
	if !strings.HasPrefix(m[1], "4") || !strings.HasPrefix(m[2], "1") {
		t.Errorf("driver figure %s -> %s, want 4 GiB -> 1 GiB (read before and after the free):\n%s", m[1], m[2], r.Stdout)
	}
}

// A free asked through the API from inside the kernel's own running cell
// cannot run before that cell ends: it fails within its deadline with an
// error that says so, and the kernel stays usable.
func TestFreeFromItsOwnRunningCell(t *testing.T) {
	t.Parallel()
	_, k, d, _ := kernelWithMagics(t, 1<<30, "--interval=100ms")
	start := time.Now()
	r := testenv.RunCell(t, k.ConnectionFile, fmt.Sprintf(`
import socket
s = socket.socket(socket.AF_UNIX)
s.settimeout(120)
s.connect(%q)
s.sendall(b"POST /api/v1/kernels/%s/free HTTP/1.1\r\nHost: local-gpumem.sock\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
print(data.decode("utf-8", "replace"))
`, d.Socket, k.ID), 90*time.Second)
	took := time.Since(start)
	if r.Status != "ok" || !strings.Contains(r.Stdout, "504") || !strings.Contains(r.Stdout, "from inside this kernel") {
		t.Fatalf("free from the kernel's own cell: %+v", r)
	}
	if took > 40*time.Second {
		t.Errorf("the refusal took %v", took)
	}
	if r := testenv.RunCell(t, k.ConnectionFile, "print(6*7)", 30*time.Second); strings.TrimSpace(r.Stdout) != "42" {
		t.Errorf("the kernel is not usable after: %+v", r)
	}
}

// gpumem free against a stopped kernel says it does not answer, not that a
// cell is running.
func TestFreeOnAStoppedKernel(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	k := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	pid := k.Cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	_, stderr, err := gpumem(t, dir, nil, "free", "--timeout=6s", k.ID)
	if err == nil {
		t.Fatal("free on a stopped kernel succeeded")
	}
	if !strings.Contains(stderr, "does not answer its heartbeat") || strings.Contains(stderr, "is busy") {
		t.Errorf("stderr does not say the kernel does not answer:\n%s", stderr)
	}
}
