package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/gpumem/gpumem/nvml"
)

var update = flag.Bool("update", false, "rewrite testdata/simulated-gpu.json")

// goldenGPUs are the devices of testdata/simulated-gpu.json; simgpu.py's
// golden() lists the same.
func goldenGPUs() []SimGPU {
	return []SimGPU{
		SimH200(0, 80<<30, FakeProc{PID: 4242, UsedBytes: 1 << 30, SMPercent: 97, MemoryPercent: 12}, FakeProc{PID: 4243, UsedBytes: 2 << 30}),
		{Name: "Simulated GH200", UUID: "GPU-1", MemoryTotalBytes: 96 << 30, UtilizationUnknown: true, Processes: []FakeProc{{PID: 4244, UsedBytes: 3 << 30}}},
		{MemoryTotalBytes: 141 << 30},
	}
}

// TestSimulatedGPUGolden pins both writers of the simulated-GPU file (this
// package's and simgpu.py) to one golden file, and that file to what
// package nvml reads from it.
func TestSimulatedGPUGolden(t *testing.T) {
	golden := filepath.Join("testdata", "simulated-gpu.json")
	got := SimulatedGPUs(goldenGPUs()...)
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test ./internal/testenv -run TestSimulatedGPUGolden -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the Go writer differs from %s (-update rewrites it):\n got %s\nwant %s", golden, got, want)
	}

	python, err := exec.LookPath("python3")
	if err != nil {
		Missing(t, "python3 runs simgpu.py, the Python tests' writer of the simulated-GPU file")
	}
	out, err := exec.Command(python, "simgpu.py").Output()
	if err != nil {
		t.Fatalf("python3 simgpu.py: %v", err)
	}
	if !bytes.Equal(out, want) {
		t.Errorf("simgpu.py (the Python tests' writer) differs from %s: change both writers together:\n got %s\nwant %s", golden, out, want)
	}

	src, err := nvml.OpenSimulated(golden)
	if err != nil {
		t.Fatalf("nvml cannot read the golden file: %v", err)
	}
	snap, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Devices) != 3 || !snap.Simulated {
		t.Fatalf("nvml read %d devices (simulated %v) from %s, want 3 simulated", len(snap.Devices), snap.Simulated, golden)
	}
	d0, d1, d2 := snap.Devices[0], snap.Devices[1], snap.Devices[2]
	if d0.Name != "Simulated H200" || d0.UUID != SimUUID(0) || d0.MemoryTotalBytes != 80<<30 || d0.MemoryUsedBytes != 3<<30 {
		t.Errorf("device 0 = %+v", d0)
	}
	if len(d0.Processes) != 2 || d0.Processes[0].PID != 4242 || d0.Processes[0].UsedBytes != 1<<30 || !d0.Processes[0].UsedKnown ||
		d0.Processes[0].Util != (nvml.Utilization{Known: true, SMPercent: 97, MemoryPercent: 12}) ||
		d0.Processes[1].Util != (nvml.Utilization{Known: true}) {
		t.Errorf("device 0's processes = %+v", d0.Processes)
	}
	if d1.Index != 1 || d1.UUID != "GPU-1" || len(d1.Processes) != 1 || d1.Processes[0].Util.Known {
		t.Errorf("device 1 (utilization unknown) = %+v", d1)
	}
	if d2.Index != 2 || d2.Name != "Simulated GPU" || d2.UUID != "GPU-SIMULATED-2" || len(d2.Processes) != 0 || d2.MemoryTotalBytes != 141<<30 {
		t.Errorf("device 2 (nvml's defaults) = %+v", d2)
	}
}

// TestDemoStartupWritesTheSameFile: the demo's kernels (examples/simulated_gpu_startup.py, copied
// alone into an IPython startup dir, so it cannot import simgpu.py) rewrite
// the simulated-GPU file in place; what they write must be what the Go
// writer writes for the same devices: every other field and GPU kept, the
// kernel's own process added, the gone ones dropped.
func TestDemoStartupWritesTheSameFile(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		Missing(t, "python3 runs the demo's startup file")
	}
	me := os.Getpid() // alive: the demo keeps it
	gpus := goldenGPUs()
	gpus[0].Processes = []FakeProc{{PID: me, UsedBytes: 5 << 30, SMPercent: 40}}
	path := SimulatedGPUFile(t, gpus...)
	script := filepath.Join(RepoRoot(), "examples", "simulated_gpu_startup.py")
	// The file as the demo's kernel leaves it while it runs, and its pid.
	cmd := exec.Command(python, "-c", `import os, sys
exec(open(sys.argv[1]).read())
sys.stdout.write("%d\n" % os.getpid() + open(os.environ["GPUMEM_DEMO_GPU"]).read())`, script)
	cmd.Env = append(os.Environ(), "GPUMEM_DEMO_GPU="+path, "GPUMEM_DEMO_BYTES=1234", "JPY_SESSION_NAME=demo.ipynb", "GPUMEM_DEMO_NOTEBOOK=demo.ipynb")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the demo's startup file: %v", err)
	}
	pidLine, doc, _ := bytes.Cut(out, []byte("\n"))
	kernel, err := strconv.Atoi(string(pidLine))
	if err != nil {
		t.Fatalf("the demo's kernel printed %q, not its pid", pidLine)
	}
	gpus[0].Processes = append(gpus[0].Processes, FakeProc{PID: kernel, UsedBytes: 1234})
	var got, want any
	if err := json.Unmarshal(doc, &got); err != nil {
		t.Fatalf("the demo wrote %q: %v", doc, err)
	}
	if err := json.Unmarshal(SimulatedGPUs(gpus...), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the demo's kernel wrote\n%s\nthe Go writer, for the same devices:\n%s", doc, SimulatedGPUs(gpus...))
	}
	// At exit it takes its own process out again.
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	gpus[0].Processes = gpus[0].Processes[:1]
	if err := json.Unmarshal(after, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(SimulatedGPUs(gpus...), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("after the demo's kernel exited the file is\n%s\nwant\n%s", after, SimulatedGPUs(gpus...))
	}
}
