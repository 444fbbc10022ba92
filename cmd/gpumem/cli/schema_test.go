package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// gpumem ls --json (standalone: Finish makes its report) carries the
// report's schema, as GET /api/v1/notebooks does, and what Finish's steps
// write (each GPU's level).
func TestLsJSONCarriesSchema(t *testing.T) {
	dir := t.TempDir()
	gpu := testenv.SimulatedGPUFile(t, testenv.SimGPU{Name: "Simulated", MemoryTotalBytes: 100})
	vars := map[string]string{"GPUMEM_FAKE_GPU": gpu, "JUPYTER_RUNTIME_DIR": filepath.Join(dir, "runtime"),
		"GPUMEM_SOCKET": filepath.Join(dir, "none.sock")}
	var stdout, stderr bytes.Buffer
	env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return vars[k] }}
	if code := Run(context.Background(), []string{"ls", "--json"}, env); code != 0 {
		t.Fatalf("gpumem ls --json: exit %d: %s", code, stderr.String())
	}
	var got struct {
		Schema *int `json:"schema"`
		GPUs   []struct {
			Level string `json:"level"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("gpumem ls --json printed %q: %v", stdout.String(), err)
	}
	if got.Schema == nil || *got.Schema != attribution.ReportSchema {
		t.Errorf("gpumem ls --json: schema %v, want %d: %s", got.Schema, attribution.ReportSchema, stdout.String())
	}
	if len(got.GPUs) != 1 || got.GPUs[0].Level != attribution.LevelOK {
		t.Errorf("gpumem ls --json: GPUs %+v, want one at level %q: %s", got.GPUs, attribution.LevelOK, stdout.String())
	}
}
