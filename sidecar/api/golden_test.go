package api

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

var update = flag.Bool("update", false, "rewrite testdata/report/golden-report-own.json at the repository's root")

// TestGoldenOwnView pins a user's own view of the golden report (what
// GET /api/v1/notebooks serves alice on a shared daemon: her notebooks,
// every other user as one holder a GPU) to
// testdata/report/golden-report-own.json, which the other languages'
// tests read beside the whole report. It reads the golden report
// attribution writes: after a change there, run
// go test -p 1 ./sidecar/attribution ./sidecar/api -run Golden -update.
func TestGoldenOwnView(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "report")
	whole, err := os.ReadFile(filepath.Join(dir, "golden-report.json"))
	if err != nil {
		t.Fatalf("%v (go test ./sidecar/attribution -run Golden -update writes it)", err)
	}
	var rep attribution.Report
	if err := json.Unmarshal(whole, &rep); err != nil {
		t.Fatalf("golden-report.json: %v", err)
	}
	got, err := json.MarshalIndent(ownView(rep, "alice"), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join(dir, "golden-report-own.json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./sidecar/api -run Golden -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from alice's own view of golden-report.json: "+
			"go test -p 1 ./sidecar/attribution ./sidecar/api -run Golden -update rewrites both.\n--- got ---\n%s", path, got)
	}
	var own attribution.Report
	if err := json.Unmarshal(got, &own); err != nil {
		t.Fatal(err)
	}
	if own.View != "own" || own.Schema != attribution.ReportSchema || len(own.Notebooks) == 0 || len(own.Notebooks) == len(rep.Notebooks) {
		t.Errorf("alice's view: view %q, schema %d, %d of %d notebooks", own.View, own.Schema, len(own.Notebooks), len(rep.Notebooks))
	}
}
