// Package archtest checks the import rules of gpumem's layout
// (see ARCHITECTURE.md): only nvml/ (and the composition root that links it)
// imports go-nvml, and protocol/ imports nothing of gpumem's but the leaf
// internal/safefile, which reads files that others may control.
package archtest

import (
	"encoding/json"
	"os/exec"
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

func TestOnlyNVMLImportsGoNVML(t *testing.T) {
	for _, p := range listPackages(t) {
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, "github.com/NVIDIA/go-nvml") && p.ImportPath != module+"/nvml" {
				t.Errorf("%s imports %s directly: only %s/nvml may", p.ImportPath, imp, module)
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
