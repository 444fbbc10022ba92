package magics

import (
	"strings"
	"testing"
)

// maxModuleLines bounds each injected module: a module of one job reads
// whole, and a longer one is a sign that it holds two (split it by concern).
const maxModuleLines = 500

// TestInjectedModulesUnder500Lines: every module of the package that
// gpumem injects into kernels (the embedded files, as they travel) is
// under maxModuleLines lines.
func TestInjectedModulesUnder500Lines(t *testing.T) {
	mods := sources()
	if len(mods) < 10 || mods["why"] == "" || mods["referrers"] == "" {
		t.Fatalf("found %d embedded modules (why: %t, referrers: %t): is this test reading the right package?",
			len(mods), mods["why"] != "", mods["referrers"] != "")
	}
	for name, src := range mods {
		if n := strings.Count(src, "\n"); n >= maxModuleLines {
			t.Errorf("magics/py/gpumem_magics/%s.py has %d lines: split it by concern to under %d", name, n, maxModuleLines)
		}
	}
}
