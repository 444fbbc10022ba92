package adversarial

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// When the Jupyter server dies first (so nothing can name the notebook any
// more) and its kernel after, the reclaim of the kernel's orphans still
// names the notebook, remembered from when the server answered.
func TestReclaimNamesNotebookAfterServerDied(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	sess := srv.CreateSession(t, "team/train.ipynb")
	k := &testenv.Kernel{Dir: srv.Dir, ConnectionFile: srv.ConnectionFile(sess.Kernel.ID), ID: sess.Kernel.ID}
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	_, orphan := spawnChildren(t, k)
	kernelPID := testenv.KernelPIDs(k.ConnectionFile)
	if len(kernelPID) != 1 {
		t.Fatalf("kernel pids %v", kernelPID)
	}
	kernel := testenv.Pin(t, kernelPID[0]) // it may end itself before the test kills it
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: orphan, UsedBytes: 1 << 30})
	d := testenv.StartDaemon(t, gpumemBin, srv.Dir, gpu, "--interval=100ms", "--reclaim-grace=500ms")
	notebook := filepath.Join(srv.RootDir, "team", "train.ipynb")
	testenv.Poll(t, 30*time.Second, "the daemon attributes the child to the notebook", func() bool {
		for _, nb := range d.Report(t).Notebooks {
			if nb.KernelID == k.ID && nb.Notebook == notebook && len(nb.PIDs) > 1 {
				return true
			}
		}
		return false
	})
	srv.Kill()
	testenv.Poll(t, 15*time.Second, "the server gone", func() bool { return srv.Exited() })
	// A scan after the server's death (its file may linger: only sessions
	// fail), then the kernel dies.
	d.WaitLog(t, 15*time.Second, "discovery", map[string]any{"error": "~" + srv.URL[len("http://"):]})
	// ipykernel ends itself within about a second of its parent's death;
	// when it already has, that is the same shutdown.
	kernel.Signal(syscall.SIGKILL)
	d.WaitLog(t, 15*time.Second, "ending orphan that holds GPU memory (SIGTERM)", map[string]any{"pid": orphan, "notebook": notebook})
}
