package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
)

// GPUMEM_TIMING=1 adds one line of phases to a standalone ls's stderr;
// without it, stderr stays empty.
func TestLsTiming(t *testing.T) {
	dir := t.TempDir()
	gpu := testenv.SimulatedGPUFile(t, testenv.SimGPU{Name: "Simulated", MemoryTotalBytes: 100})
	run := func(timing string) string {
		vars := map[string]string{"GPUMEM_FAKE_GPU": gpu, "JUPYTER_RUNTIME_DIR": filepath.Join(dir, "runtime"),
			"GPUMEM_SOCKET": filepath.Join(dir, "none.sock"), "GPUMEM_TIMING": timing}
		var stdout, stderr bytes.Buffer
		env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return vars[k] }}
		if code := Run(context.Background(), []string{"ls", "--json"}, env); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		return stderr.String()
	}
	if got := run(""); got != "" {
		t.Errorf("stderr without GPUMEM_TIMING: %q", got)
	}
	got := run("1")
	for _, phase := range []string{"daemon_probe", "nvml_open", "nvml_sample", "discover", "wait_gpus", "observe", "output", "total"} {
		if !regexp.MustCompile(`\b` + phase + `=[0-9]+\.[0-9]{2}ms\b`).MatchString(got) {
			t.Errorf("no %s in %q", phase, got)
		}
	}
	if !regexp.MustCompile(`^gpumem timing: .*\n$`).MatchString(got) {
		t.Errorf("not one timing line: %q", got)
	}
}
