package metrics

import (
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

// The daemon's history sets each notebook's peak; the gauge follows it, one
// series per kernel, and goes with the per-notebook series.
func TestNotebookPeak(t *testing.T) {
	snap := testSnapshot()
	snap.Report.Notebooks[0].PeakBytes = 3 * gib
	snap.Report.Notebooks = append(snap.Report.Notebooks, snap.Report.Notebooks[0]) // a duplicate entry
	expected := `# HELP gpumem_notebook_gpu_memory_peak_bytes Highest GPU memory of a notebook's kernel (all GPUs) since its process started, as the daemon sampled it, in bytes.
# TYPE gpumem_notebook_gpu_memory_peak_bytes gauge
gpumem_notebook_gpu_memory_peak_bytes{kernel_id="kernel-a",notebook="/home/alice/a.ipynb",user="alice"} 3.221225472e+09
`
	m := New(&fakeSource{snap: snap}, zerolog.New(io.Discard))
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(expected), "gpumem_notebook_gpu_memory_peak_bytes"); err != nil {
		t.Error(err)
	}
	off := New(&fakeSource{snap: snap}, zerolog.New(io.Discard), PerNotebook(false))
	if n, err := testutil.GatherAndCount(off.Registry(), "gpumem_notebook_gpu_memory_peak_bytes"); err != nil || n != 0 {
		t.Errorf("without per-notebook series: %d peak series, %v", n, err)
	}
}
