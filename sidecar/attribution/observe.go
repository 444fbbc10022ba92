package attribution

import (
	"context"
	"fmt"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// GPUSampler reads GPU memory per process: the NVML driver, or the
// simulated-GPU file.
type GPUSampler interface {
	Sample(ctx context.Context) (nvml.Snapshot, error)
}

// ProcScanner reads the process table, in full for the pids given
// (procs.FS).
type ProcScanner interface {
	ScanTree(details []int) (*procs.Table, error)
}

// TreeScanner is a ProcScanner told which pids are kernels, that keeps
// their trees between calls and reads per call only what may have changed
// (procs.Tracker): the daemon's samples. Its table holds the kernels'
// trees and the pids asked about; other processes may be missing from it.
type TreeScanner interface {
	ScanTrees(kernels []procs.Root, details []int) (*procs.Table, error)
}

// Observation is one reading of the GPUs and of /proc, and its report.
type Observation struct {
	Snapshot nvml.Snapshot
	Table    *procs.Table
	Report   Report
}

// Observe is the one pipeline from the GPUs and /proc to a report: `gpumem
// ls`, the daemon's samples, a kernel's figure around a free and reclaim
// all read through it.
func Observe(ctx context.Context, gpus GPUSampler, scanner ProcScanner, kernels []Kernel) (Observation, error) {
	snap, err := gpus.Sample(ctx)
	if err != nil {
		return Observation{}, fmt.Errorf("sampling GPUs: %w", err)
	}
	return ObserveSnapshot(snap, scanner, kernels)
}

// ObserveSnapshot is Observe with the GPUs already read (a caller that
// overlaps NVML's start with other work).
func ObserveSnapshot(snap nvml.Snapshot, scanner ProcScanner, kernels []Kernel) (Observation, error) {
	table, err := scanner.ScanTree(DetailPIDs(snap, kernels))
	if err != nil {
		return Observation{}, fmt.Errorf("reading processes: %w", err)
	}
	return Observation{Snapshot: snap, Table: table, Report: MakeReport(snap, table, kernels)}, nil
}

// MakeReport is the report of one reading: the join (Attribute), then each
// process's and notebook's utilization (AddUtilization).
func MakeReport(snap nvml.Snapshot, table *procs.Table, kernels []Kernel) Report {
	rep := Attribute(snap, table, kernels)
	AddUtilization(&rep, snap)
	return rep
}

// ObserveTrees is Observe through a TreeScanner: a sample of the daemon,
// which follows the same kernels from one sample to the next, attributing
// through memo (nil: none). Its Table lacks processes of no kernel's tree
// that are not on a GPU: an exit is judged, and a tree reclaimed, on
// Observe's.
func ObserveTrees(ctx context.Context, gpus GPUSampler, scanner TreeScanner, kernels []Kernel, memo *Memo) (Observation, error) {
	snap, err := gpus.Sample(ctx)
	if err != nil {
		return Observation{}, fmt.Errorf("sampling GPUs: %w", err)
	}
	table, err := scanner.ScanTrees(KernelRoots(kernels), DetailPIDs(snap, kernels))
	if err != nil {
		return Observation{}, fmt.Errorf("reading processes: %w", err)
	}
	if memo == nil {
		return Observation{Snapshot: snap, Table: table, Report: MakeReport(snap, table, kernels)}, nil
	}
	return Observation{Snapshot: snap, Table: table, Report: memo.Attribute(snap, table, kernels)}, nil
}

// KernelRoots lists the kernels' processes whose trees a TreeScanner keeps.
func KernelRoots(kernels []Kernel) []procs.Root {
	roots := make([]procs.Root, 0, len(kernels))
	for _, k := range kernels {
		if k.PID > 0 {
			roots = append(roots, procs.Root{PID: k.PID, StartTime: k.StartTime})
		}
	}
	return roots
}

// BytesByPID sums each process's memory over all GPUs. A process listed
// with unknown memory holds some: it counts, with 0 bytes.
func BytesByPID(snap nvml.Snapshot) map[int]uint64 {
	out := map[int]uint64{}
	for _, dev := range snap.Devices {
		for _, p := range dev.Processes {
			out[p.PID] += known(p)
		}
	}
	return out
}
