package serve

import (
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// TestCullWarningInCell: an idle kernel holding GPU memory, warned that
// culling will report it, prints the warning before its next cell: the
// daemon's sentence once, after one "gpumem: ", then the cell's output.
func TestCullWarningInCell(t *testing.T) {
	_, nb, d, _ := cullSetup(t, "report", 2<<30, "--cull-warn=10m")
	kid := nb.sess.Kernel.ID
	d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": kid})
	d.WaitLog(t, 60*time.Second, "idle kernel holds GPU memory: warned", map[string]any{"kernel_id": kid})
	// The alert file is written in the sample whose report shows the
	// warning, before it is published.
	testenv.Poll(t, 30*time.Second, "the warning in the report", func() bool {
		for _, a := range d.Report(t).Alerts {
			if a.Kind == attribution.AlertCull && len(a.Kernels) == 1 && a.Kernels[0] == kid {
				return true
			}
		}
		return false
	})
	out := nb.front.Cell(t, "print('ran')").Text()
	want := "gpumem: this kernel holds 2.0 GiB and has been idle "
	if strings.Count(out, want) != 1 || strings.Count(out, "gpumem:") != 1 || !strings.Contains(out, "will be reported as an idle GPU holder at ") {
		t.Errorf("the cell printed %q, want the warning once: %q...", out, want)
	}
	if !strings.HasSuffix(out, "ran\n") {
		t.Errorf("the cell's own output is not after the warning: %q", out)
	}
}
