package adversarial

import (
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestFreeRefusesAShortPrefix: gpumem free --all deletes a notebook's
// variables, so the kernel it acts on is named by at least 4 characters
// of its id (or its notebook, or its file): a one-character prefix that
// happens to match one kernel deletes nothing.
func TestFreeRefusesAShortPrefix(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	k := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	if r := testenv.RunCell(t, k.ConnectionFile, "keep = bytearray(1 << 20)\nprint('set')", 30*time.Second); strings.TrimSpace(r.Stdout) != "set" {
		t.Fatalf("setting a variable: %+v", r)
	}
	for _, prefix := range []string{k.ID[:1], k.ID[:3]} {
		_, stderr, err := gpumem(t, dir, nil, "free", prefix, "--all")
		if err == nil || !strings.Contains(stderr, "too short to name the kernel") {
			t.Errorf("gpumem free %s --all: err %v, stderr %q; want it refused as too short", prefix, err, stderr)
		}
	}
	if r := testenv.RunCell(t, k.ConnectionFile, "print('keep' in globals())", 30*time.Second); strings.TrimSpace(r.Stdout) != "True" {
		t.Fatalf("the variable is gone after refused frees: %+v", r)
	}
	// Four characters are enough.
	if _, stderr, err := gpumem(t, dir, nil, "free", k.ID[:4]); err != nil {
		t.Fatalf("gpumem free %s (4 characters): %v\n%s", k.ID[:4], err, stderr)
	}
}
