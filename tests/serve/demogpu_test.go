package serve

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// TestDemoGPUFollowsRestart: gpumem demo's simulated GPU is kept by
// the kernels themselves (examples/simulated_gpu_startup.py, an IPython
// startup file): a kernel restarted from the panel holds the demo's 3 GiB
// under its new pid, and the old pid is gone from the file, so the panel
// never shows 0 B for the notebook and a dead process for an "unknown"
// user.
func TestDemoGPUFollowsRestart(t *testing.T) {
	testenv.Require(t, "ipykernel")
	gpu := testenv.NewFakeGPU(t)
	ipython := t.TempDir()
	startup := filepath.Join(ipython, "profile_default", "startup")
	if err := os.MkdirAll(startup, 0o700); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "examples", "simulated_gpu_startup.py"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(startup, "00-gpumem-demo-gpu.py"), src, 0o600); err != nil {
		t.Fatal(err)
	}
	const held = 3 << 30
	srv := testenv.StartServer(t, testenv.NotebookServer(), "IPYTHONDIR="+ipython, "GPUMEM_DEMO_GPU="+gpu.Path,
		"GPUMEM_DEMO_BYTES="+strconv.Itoa(held))
	d := startDaemon(t, srv, gpu)
	sess := srv.CreateSession(t, "leaks.ipynb")

	holder := func() (attribution.Report, int) {
		rep := d.Report(t)
		for _, nb := range rep.Notebooks {
			if nb.KernelID == sess.Kernel.ID && nb.GPUMemoryBytes == held && len(nb.PIDs) > 0 {
				return rep, nb.PIDs[0]
			}
		}
		return rep, 0
	}
	var first int
	testenv.Poll(t, 60*time.Second, "the kernel holding the demo's 3 GiB", func() bool {
		_, first = holder()
		return first > 0
	})
	srv.JSON(t, http.MethodPost, "api/kernels/"+sess.Kernel.ID+"/restart", nil, nil)
	var rep attribution.Report
	second := 0
	testenv.Poll(t, 60*time.Second, "the restarted kernel holding the demo's 3 GiB under its new pid", func() bool {
		rep, second = holder()
		return second > 0 && second != first && len(rep.Other) == 0
	})
	for _, w := range rep.Warnings {
		if strings.Contains(w, "not found in /proc") {
			t.Errorf("a dead pid is still on the simulated GPU: %s", w)
		}
	}
	var file struct {
		GPUs []struct {
			Processes []struct {
				PID int `json:"pid"`
			} `json:"processes"`
		} `json:"gpus"`
	}
	data, err := os.ReadFile(gpu.Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatalf("%s: %v\n%s", gpu.Path, err, data)
	}
	var pids []int
	for _, p := range file.GPUs[0].Processes {
		pids = append(pids, p.PID)
	}
	if !slices.Equal(pids, []int{second}) {
		t.Fatalf("simulated GPU lists pids %v, want only the new kernel %d (old %d)", pids, second, first)
	}
}
