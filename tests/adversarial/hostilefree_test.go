package adversarial

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
)

// A kernel renders its own free report, and its user can replace the
// injected code that does: here it claims "40 GiB -> 0" from the driver
// and writes escape sequences meant for the admin's terminal. `gpumem
// free` must show the driver's figures that the daemon read (4 GiB before
// and after: the simulated GPU does not change) on the one line of
// gpumem's own, the kernel's text marked as the kernel's and escaped; the
// API's JSON (what JupyterLab's notification shows) must carry the
// daemon's figures too, and a refusal's text reach stderr escaped.
func TestHostileKernelCannotFakeItsFreeReport(t *testing.T) {
	t.Parallel()
	dir, k, d, gpu := kernelWithMagics(t, 4<<30, "--interval=100ms")
	r := testenv.RunCell(t, k.ConnectionFile, `import sys
_m = sys.modules["_gpumem_magics"].magic
def _fake(req):
    return {"kind": "free", "schema": 1, "cache_only": True, "deleted": [], "hidden": [], "frameworks": [],
            "driver": {"before": 40 << 30, "after": 0}, "notes": [],
            "text": "gpumem free: emptied the caches\n\x1b[2J\x1b[H\x1b]0;owned\x07"
                    "driver (NVML): 40.00 GiB -> 0 B for this kernel (-40.00 GiB)\r",
            "html": ""}
_m.api_free = _fake
_m.api_render = _fake
print("replaced")`, 60*time.Second)
	if r.Status != "ok" || !strings.Contains(r.Stdout, "replaced") {
		t.Fatalf("replacing the kernel's free: %+v", r)
	}
	stdout, stderr, err := gpumem(t, dir, gpu, "free", k.ID)
	if err != nil {
		t.Fatalf("gpumem free: %v\n%s", err, stderr)
	}
	if i := strings.IndexAny(stdout, "\x1b\x07\r"); i >= 0 {
		t.Errorf("gpumem free writes %q to the terminal (byte %d):\n%q", stdout[i], i, stdout)
	}
	var driver []string
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "driver") {
			driver = append(driver, line)
		}
	}
	if len(driver) != 1 || !strings.Contains(driver[0], "4.0 GiB -> 4.0 GiB") {
		t.Errorf("driver lines %q: want one, gpumem's, 4.0 GiB -> 4.0 GiB\n%s", driver, stdout)
	}
	if !strings.Contains(stdout, "kernel| ") || !strings.Contains(stdout, `\x1b[2J`) {
		t.Errorf("the kernel's text is not shown marked as its own and escaped:\n%s", stdout)
	}

	// What the API answers (JupyterLab's notification shows its figures).
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	raw, err := d.Client.Free(ctx, k.ID, api.FreeRequest{}) // cache only, as the notification's button
	if err != nil {
		t.Fatalf("POST free: %v", err)
	}
	var rep struct {
		Driver *struct{ Before, After uint64 } `json:"driver"`
		Text   string                          `json:"text"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("free reply %s: %v", raw, err)
	}
	if rep.Driver == nil || rep.Driver.Before != 4<<30 || rep.Driver.After != 4<<30 {
		t.Errorf("the API's driver figure %+v: want the daemon's 4 GiB -> 4 GiB", rep.Driver)
	}
	if strings.ContainsAny(rep.Text, "\x1b\x07\r") {
		t.Errorf("the API's text carries control characters: %q", rep.Text)
	}

	// A refusal: its text is the kernel's too.
	testenv.RunCell(t, k.ConnectionFile, `import sys
sys.modules["_gpumem_magics"].magic.api_free = lambda req: {"kind": "free", "error": "\x1b[2J\x1b]0;owned\x07no variable"}`,
		60*time.Second)
	_, stderr, err = gpumem(t, dir, gpu, "free", k.ID, "--vars=x")
	if err == nil || !strings.Contains(stderr, "no variable") || strings.ContainsAny(stderr, "\x1b\x07") {
		t.Errorf("a refused free: %v, stderr %q: want a failure, the kernel's text escaped", err, stderr)
	}
}
