package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// podsOf answers attribution.Pods from a fixed map by pid.
type podsOf map[int]attribution.Pod

func (p podsOf) PodOf(pid int, _ uint64) (attribution.Pod, bool) {
	pod, ok := p[pid]
	return pod, ok
}

// TestSampleAddsPods: with Config.Pods, the report the daemon keeps (and
// serves to ls, the API and /metrics) names each GPU process's pod.
func TestSampleAddsPods(t *testing.T) {
	dir := t.TempDir()
	self := os.Getpid()
	gpuFile := testenv.SimulatedGPUFile(t, testenv.SimGPU{Name: "Simulated", UUID: "GPU-1", MemoryTotalBytes: 80 << 30,
		Processes: []testenv.FakeProc{{PID: self, UsedBytes: 1 << 30}}})
	pod := attribution.Pod{Name: "trainer-0", Namespace: "ml", UID: "u", Container: "main", User: "alice"}
	gpus, err := nvml.OpenSimulated(gpuFile)
	if err != nil {
		t.Fatal(err)
	}
	defer gpus.Close()
	proc := &procs.FS{}
	d, err := New(Config{RuntimeDirs: []string{dir}, SocketPath: filepath.Join(dir, "gpumem.sock")},
		Deps{GPUs: gpus, Procs: proc, Finder: discovery.NewProcFinder(proc), Pods: podsOf{self: pod}}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); d.wg.Wait() }()

	d.sample(ctx)
	rep, err := d.api().Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Other) != 1 || rep.Other[0].PID != self {
		t.Fatalf("other processes %+v, want this test's process", rep.Other)
	}
	if rep.Other[0].Pod == nil || *rep.Other[0].Pod != pod {
		t.Errorf("pod %+v, want %+v", rep.Other[0].Pod, pod)
	}
}
