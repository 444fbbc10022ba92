// Package archtest checks the import rules of gpumem's layout (see
// ARCHITECTURE.md): only nvml/driver imports go-nvml (cgo), the packages
// that only consume GPU snapshots link no cgo at all, and protocol/ imports
// nothing of gpumem's but the leaf internal/safefile, which reads files that
// others may control. The composition root sits beside its command
// (cmd/gpumem/cli, imported only there), and internal/ holds only leaves and
// the test harness, which the binary never links.
package archtest

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gpumem/gpumem"

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

const goNVML = "github.com/NVIDIA/go-nvml"

func TestOnlyDriverImportsGoNVML(t *testing.T) {
	importers := 0
	for _, p := range listPackages(t) {
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, goNVML) {
				continue
			}
			if p.ImportPath != module+"/nvml/driver" {
				t.Errorf("%s imports %s directly: only %s/nvml/driver may", p.ImportPath, imp, module)
			} else {
				importers++
			}
		}
	}
	if importers == 0 {
		t.Errorf("%s/nvml/driver does not import %s: is this test looking at the right tree?", module, goNVML)
	}
}

// TestConsumersLinkNoCgo: the packages that compute on snapshots (and
// nvml's value types themselves) build and test without cgo's go-nvml.
func TestConsumersLinkNoCgo(t *testing.T) {
	consumers := []string{"nvml", "sidecar/attribution", "sidecar/api", "sidecar/metrics", "sidecar/discovery", "sidecar/procs"}
	for _, c := range consumers {
		out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", module+"/"+c).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", c, err)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, module+"/"+c) {
			t.Fatalf("%s is not in its own dependency list: did the package move?", c)
		}
		for _, d := range deps {
			if strings.HasPrefix(d, goNVML) || d == module+"/nvml/driver" {
				t.Errorf("%s depends on %s (cgo): it should need only package nvml's value types", c, d)
			}
		}
	}
}

func TestProtocolImportsNothingOfOurs(t *testing.T) {
	for _, p := range listPackages(t) {
		if p.ImportPath != module+"/protocol" {
			continue
		}
		for _, d := range p.Deps {
			if strings.HasPrefix(d, module+"/") && d != module+"/internal/safefile" {
				t.Errorf("protocol depends on %s", d)
			}
		}
		return
	}
	t.Fatal("package protocol not found")
}

// TestInternalHoldsLeavesAndTheHarness: the composition root lives beside its
// command (cmd/gpumem/cli), so internal/ holds only leaves, which import
// nothing of gpumem's outside internal/, and the test harness, which no
// shipped package imports.
func TestInternalHoldsLeavesAndTheHarness(t *testing.T) {
	const harness = module + "/internal/testenv"
	leaves := 0
	for _, p := range listPackages(t) {
		if !strings.HasPrefix(p.ImportPath, module+"/internal/") || p.ImportPath == harness {
			continue
		}
		leaves++
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/") && !strings.HasPrefix(imp, module+"/internal/") {
				t.Errorf("%s imports %s: internal/ holds leaves only (the wiring belongs in cmd/gpumem/cli)", p.ImportPath, imp)
			}
		}
	}
	if leaves < 3 {
		t.Fatalf("found only %d packages under internal/: is this test looking at the right tree?", leaves)
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", module+"/cmd/gpumem").Output()
	if err != nil {
		t.Fatalf("go list -deps cmd/gpumem: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"/cmd/gpumem/cli") {
		t.Fatalf("cmd/gpumem does not depend on cmd/gpumem/cli: did the composition root move?")
	}
	if slices.Contains(deps, harness) {
		t.Errorf("the gpumem binary links %s: the test harness must not ship", harness)
	}
}

// TestCompositionRootImportedOnlyByItsCommand: cmd/gpumem/cli wires the real
// dependencies; only its main (and tests, which drive cli.Run) may import it.
func TestCompositionRootImportedOnlyByItsCommand(t *testing.T) {
	const root = module + "/cmd/gpumem/cli"
	for _, p := range listPackages(t) {
		if p.ImportPath == module+"/cmd/gpumem" || strings.HasPrefix(p.ImportPath, module+"/tests/") {
			continue
		}
		if slices.Contains(p.Imports, root) {
			t.Errorf("%s imports %s: only cmd/gpumem may", p.ImportPath, root)
		}
	}
}
