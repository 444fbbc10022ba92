package attribution

import (
	"testing"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/procs"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// The figure that matters: process scan and attribution over a 5,000-process
// fixture tree, target < 30 ms. The tree (20 kernels with workers and deep
// chains, orphans, daemons) is written once into a temp dir; each iteration
// is what `gpumem ls` does after sampling NVML: ScanTree with details for
// the kernels and GPU processes, then Attribute. 8 GPUs; each kernel and a
// worker of each hold memory, plus 10 unrelated processes.
func BenchmarkScanAndAttribute5000(b *testing.B) {
	root := b.TempDir()
	fixture, kernelPIDs := procstest.Tree(5000, 20)
	procstest.WriteTree(b, root, fixture)
	snap, kernels := benchSnapshot(kernelPIDs)
	fs := &procs.FS{Root: root}
	for b.Loop() {
		table, err := fs.ScanTree(DetailPIDs(snap, kernels))
		if err != nil {
			b.Fatal(err)
		}
		rep := Attribute(snap, table, kernels)
		if len(rep.Notebooks) != 20 || rep.Notebooks[0].GPUMemoryBytes == 0 || len(rep.Other) != 10 {
			b.Fatalf("unexpected report: %d notebooks, %d other", len(rep.Notebooks), len(rep.Other))
		}
	}
}

// Attribute alone, on the same data (table built once).
func BenchmarkAttribute5000(b *testing.B) {
	fixture, kernelPIDs := procstest.Tree(5000, 20)
	ps := make([]procs.Proc, len(fixture))
	for i, f := range fixture {
		ps[i] = procs.Proc{PID: f.PID, PPID: f.PPID, PGID: f.PGID, SID: f.SID, StartTime: f.Start, Comm: f.Comm, Argv: f.Argv, Detailed: true}
	}
	table := procs.NewTable(ps)
	snap, kernels := benchSnapshot(kernelPIDs)
	for b.Loop() {
		_ = Attribute(snap, table, kernels)
	}
}

func benchSnapshot(kernelPIDs []int) (nvml.Snapshot, []Kernel) {
	snap := nvml.Snapshot{}
	for i := range 8 {
		snap.Devices = append(snap.Devices, nvml.Device{Index: i, UUID: "GPU-bench", Name: "NVIDIA H200", MemoryTotalBytes: 141 * gib})
	}
	kernels := make([]Kernel, len(kernelPIDs))
	for i, pid := range kernelPIDs {
		kernels[i] = Kernel{ID: "kernel", Notebook: "/nb.ipynb", PID: pid, StartTime: uint64(pid)}
		d := &snap.Devices[i%8]
		d.Processes = append(d.Processes, gpuProc(pid, gib), gpuProc(pid+1, 512*mib))
		d.MemoryUsedBytes += gib + 512*mib
	}
	for i := range 10 { // daemons' workers (pids from procstest.Tree)
		d := &snap.Devices[i%8]
		d.Processes = append(d.Processes, gpuProc(200001+3*i, 256*mib))
		d.MemoryUsedBytes += 256 * mib
	}
	return snap, kernels
}
