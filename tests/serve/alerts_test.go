package serve

import (
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestServeNotebookAlerts: when a GPU passes --alert-threshold, the next
// cell run in each notebook using it prints one line naming the biggest
// holders, once; %gpumem top lists who holds the GPU.
func TestServeNotebookAlerts(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	gpu := testenv.NewFakeGPU(t)
	d := startDaemon(t, srv, gpu, "--alert-threshold=0.5")
	nb := openNotebook(t, srv, "big/model.ipynb")
	nb.waitMagic(t, 10*time.Second)
	other := startUnrelated(t)
	gpu.Set(t, testenv.FakeProc{PID: nb.pid, UsedBytes: 40 << 30}, testenv.FakeProc{PID: other.Process.Pid, UsedBytes: 10 << 30}) // 50 of 80 GiB
	waitNotebookHas(t, d, nb.sess.Kernel.ID, nb.pid)

	var alert string
	testenv.Poll(t, 10*time.Second, "the alert line in a cell's output", func() bool {
		out := nb.front.Cell(t, "pass").Text()
		if strings.Contains(out, "gpumem: GPU 0") {
			alert = out
			return true
		}
		return false
	})
	for _, want := range []string{"62% full", "model.ipynb 40.0 GiB", "%gpumem free"} {
		if !strings.Contains(alert, want) {
			t.Errorf("alert %q lacks %q", alert, want)
		}
	}
	if out := nb.front.Cell(t, "1+1").Text(); strings.Contains(out, "gpumem:") {
		t.Errorf("alert shown twice: %q", out)
	}
	if _, ok := d.FindLog("GPU memory over the alert threshold", map[string]any{"gpu": 0}); !ok {
		t.Error("no alert log line")
	}

	top := nb.front.Cell(t, "%gpumem top").Text()
	for _, want := range []string{"model.ipynb", "<- this kernel", "/bin/sleep 600", "40.0 GiB", "10.0 GiB"} {
		if !strings.Contains(top, want) {
			t.Errorf("%%gpumem top lacks %q:\n%s", want, top)
		}
	}
}
