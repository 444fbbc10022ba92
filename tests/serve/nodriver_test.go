package serve

import (
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/nvml"
)

// TestMagicsSayNoDriver: on a machine without an NVIDIA driver gpumem
// serve reports no GPU and says why; %gpumem and %gpumem top say that
// sentence, in the daemon's words, never "0 B" for this kernel nor a
// guess at MIG.
func TestMagicsSayNoDriver(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	// No simulated GPU: the daemon opens the real driver, if any.
	d := testenv.StartDaemonEnv(t, gpumemBin, srv.Dir, testenv.NewFakeGPU(t), []string{"GPUMEM_FAKE_GPU="})
	if rep := d.Report(t); len(rep.GPUs) > 0 {
		t.Skipf("this machine has a GPU driver (%d GPUs): nothing to check without one", len(rep.GPUs))
	}
	nb := openNotebook(t, srv, "nodriver/nb.ipynb")
	nb.waitMagic(t, 30*time.Second)
	want := "GPU n/a: " + nvml.NoDriverWarning
	for _, magic := range []string{"%gpumem", "%gpumem top"} {
		var out string
		testenv.Poll(t, 20*time.Second, magic+" saying there is no driver", func() bool {
			out = nb.front.Cell(t, magic).Text()
			return strings.Contains(out, want)
		})
		if strings.Contains(out, "0 B for this kernel") || strings.Contains(out, "MIG") {
			t.Errorf("%s shows a figure it does not have:\n%s", magic, out)
		}
	}
}
