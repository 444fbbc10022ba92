package serve

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/nvml"
)

// TestServeSaysNoDriverOnce: on a host without the NVIDIA driver (and no
// simulated GPU), gpumem serve says so in one log line at start, as the
// README promises, and not again at every sample.
func TestServeSaysNoDriverOnce(t *testing.T) {
	if out, _ := exec.Command("ldconfig", "-p").Output(); strings.Contains(string(out), "libnvidia-ml.so.1") {
		t.Skip("this host has an NVIDIA driver: the no-driver start does not apply")
	}
	dir := t.TempDir()
	d := testenv.StartDaemon(t, gpumemBin, dir, &testenv.FakeGPU{}) // no GPUMEM_FAKE_GPU file: the real driver, absent
	// Three samples (at 1 s) later the report still says it, and the log
	// said it once.
	start := time.Now()
	testenv.Poll(t, 20*time.Second, "three samples without a driver", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rep, err := d.Client.Notebooks(ctx)
		return err == nil && slices.Contains(rep.Warnings, nvml.NoDriverWarning) && time.Since(start) > 3500*time.Millisecond
	})
	if n := strings.Count(d.Output(), nvml.NoDriverWarning); n != 1 {
		t.Fatalf("the log says %q %d times, want once at start:\n%s", nvml.NoDriverWarning, n, d.Output())
	}
	if _, ok := d.FindLog(nvml.NoDriverWarning, map[string]any{"level": "warn"}); !ok {
		t.Fatalf("no warn-level log line %q:\n%s", nvml.NoDriverWarning, d.Output())
	}
}
