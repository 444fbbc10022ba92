package adversarial

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// kernelManagerPy starts a kernel as scripts, nbclient and papermill do
// (jupyter_client's KernelManager, whose connection file is a temp file,
// /tmp/tmpXXXX.json, outside every runtime dir), prints its file and pid,
// and keeps it until killed.
const kernelManagerPy = `
import json, time
from jupyter_client import KernelManager
km = KernelManager(kernel_name="python3")
km.start_kernel()
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
kc.stop_channels()
print(json.dumps({"file": km.connection_file, "pid": km.provisioner.process.pid}), flush=True)
time.sleep(3600)
`

// The daemon follows every kernel `gpumem kernels` lists, those a
// KernelManager started with a /tmp connection file too: it injects
// %gpumem within 30 s, attributes the kernel's processes to it, reclaims
// its orphan holding GPU memory once it is killed, and then forgets it
// (its file stays in /tmp, but no process names it any more).
func TestKernelManagerKernelFollowed(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel", "jupyter_client")
	dir := jupyterDir(t)
	gpu := testenv.NewFakeGPU(t)
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=200ms", "--reclaim-grace=500ms")

	driver := testenv.Start(t, testenv.Env(dir), dir, testenv.Python(), "-c", kernelManagerPy)
	var started struct {
		File string `json:"file"`
		PID  int    `json:"pid"`
	}
	testenv.Poll(t, 90*time.Second, "the KernelManager's kernel", func() bool {
		if driver.Exited() {
			t.Fatalf("the KernelManager script exited:\n%s", driver.Output())
		}
		for _, line := range strings.Split(driver.Output(), "\n") {
			if strings.HasPrefix(line, `{"file"`) && json.Unmarshal([]byte(line), &started) == nil {
				return true
			}
		}
		return false
	})
	testenv.NewReaper(t, nil).Add(started.PID)
	kernel := testenv.Pin(t, started.PID) // the KernelManager's child, not the test's
	t.Cleanup(func() { _ = os.Remove(started.File) })
	if filepath.Dir(started.File) != os.TempDir() || !strings.HasPrefix(filepath.Base(started.File), "tmp") {
		t.Fatalf("the KernelManager wrote %s: not a temp file outside the runtime dir", started.File)
	}
	id := strings.TrimSuffix(filepath.Base(started.File), ".json")
	gpu.Set(t, testenv.FakeProc{PID: started.PID, UsedBytes: 1 << 30})

	ready := time.Now()
	d.WaitLog(t, 30*time.Second, "magics injected", map[string]any{"kernel_id": id})
	t.Logf("%%gpumem injected %v after the kernel was ready", time.Since(ready).Round(100*time.Millisecond))
	if r := testenv.RunCell(t, started.File, "print(get_ipython().find_line_magic('gpumem') is not None)", 60*time.Second); strings.TrimSpace(r.Stdout) != "True" {
		t.Fatalf("%%gpumem is not registered in the kernel: %+v", r)
	}

	// A worker in a session of its own: a kill of the kernel leaves it.
	r := testenv.RunCell(t, started.File, "import subprocess\n"+
		"_w = subprocess.Popen(['sleep', '600'], start_new_session=True)\nprint(_w.pid)", 60*time.Second)
	worker, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if err != nil {
		t.Fatalf("starting a worker: %+v", r)
	}
	testenv.NewReaper(t, nil).Add(worker)
	gpu.Set(t, testenv.FakeProc{PID: started.PID, UsedBytes: 1 << 30}, testenv.FakeProc{PID: worker, UsedBytes: 2 << 30})
	testenv.Poll(t, 30*time.Second, "the daemon attributes the worker to the kernel", func() bool {
		under, _ := kernelHolds(d.Report(t), id, worker)
		return under
	})

	if !kernel.Signal(syscall.SIGKILL) {
		t.Fatalf("the kernel (pid %d) had ended before the test killed it", started.PID)
	}
	d.WaitLog(t, 15*time.Second, "orphan ended", map[string]any{"kernel_id": id, "pid": worker})
	testenv.Poll(t, 10*time.Second, "the worker to be gone", func() bool { return !testenv.Alive(worker) })
	d.WaitLog(t, 30*time.Second, "no process names the connection file any more: the kernel is over, not followed",
		map[string]any{"kernel_id": id})
}
