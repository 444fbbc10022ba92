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
	rep := Attribute(snap, table, kernels)
	AddUtilization(&rep, snap)
	return Observation{Snapshot: snap, Table: table, Report: rep}, nil
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
