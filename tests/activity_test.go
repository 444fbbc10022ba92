package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// kubeflowActivity is the JSON Kubeflow Notebooks' culling controller
// reads from an exec activity probe's output file.
type kubeflowActivity struct {
	HasActivity  *bool   `json:"has_activity,omitempty"`
	LastActivity *string `json:"last_activity,omitempty"`
}

// TestActivityProbe: `gpumem activity --output FILE` in a workspace with a
// real server and kernel on the simulated GPU, as Kubeflow's probe runs it:
// a kernel that holds memory and does nothing gives its last use (RFC
// 3339, no later than now); the same kernel computing (90 % SM) gives
// has_activity true, although no cell runs. The file holds exactly the
// JSON printed, in the controller's schema.
func TestActivityProbe(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t, testenv.NotebookServer())
	reap := testenv.NewReaper(t, srv)
	sess := srv.CreateSession(t, "work/train.ipynb")
	pid := testenv.KernelPID(t, srv.ConnectionFile(sess.Kernel.ID))
	reap.Add(pid)
	out := filepath.Join(t.TempDir(), "activity.json")
	probe := func(sm uint32) (kubeflowActivity, string) {
		t.Helper()
		gpu := testenv.SimulatedGPUFile(t, testenv.SimGPU{Name: "Simulated H200", UUID: "GPU-act-0", MemoryTotalBytes: 80 << 30,
			Processes: []testenv.FakeProc{{PID: pid, UsedBytes: 8 << 30, SMPercent: sm}}})
		res := runGpumem(t, gpumemEnv(srv.Dir, "GPUMEM_FAKE_GPU="+gpu), "activity", "--output", out)
		if res.Code != 0 {
			t.Fatalf("gpumem activity: want exit 0\n%s", res)
		}
		file, err := os.ReadFile(out)
		if err != nil || string(file) != res.Stdout {
			t.Fatalf("--output file %q (%v), stdout %q: want the same JSON", file, err, res.Stdout)
		}
		var got kubeflowActivity
		dec := json.NewDecoder(bytes.NewReader(file))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil || (got.HasActivity != nil) == (got.LastActivity != nil) {
			t.Fatalf("%s is not one of Kubeflow's answers (%v)", file, err)
		}
		return got, res.Stderr
	}
	idle, why := probe(0)
	if idle.LastActivity == nil || !strings.Contains(why, "last used") {
		t.Fatalf("an idle kernel holding 8 GiB: %+v (%s), want its last use", idle, why)
	}
	if at, err := time.Parse(time.RFC3339, *idle.LastActivity); err != nil || at.After(time.Now().Add(time.Second)) || time.Since(at) > 10*time.Minute {
		t.Errorf("last_activity %q (%v): want the kernel's last use, just now", *idle.LastActivity, err)
	}
	busy, why := probe(90)
	if busy.HasActivity == nil || !*busy.HasActivity || !strings.Contains(why, "train.ipynb computes on a GPU now (90% SM)") {
		t.Errorf("a kernel computing on the GPU: %+v (%s), want has_activity true", busy, why)
	}
}
