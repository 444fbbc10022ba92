package daemon

import (
	"context"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// observeSample reads the GPUs and /proc for a sample: through Deps.Procs'
// kept trees when it keeps them (attribution.TreeScanner: it then reads
// what changed, not every process of the host; and when nothing did, the
// report is the last one: d.memo), and again in full when
// that view lacks a followed kernel's process or shows it a zombie. An
// exit is confirmed, and a dead kernel's tree handed to reclaim, only
// after a fresh full view (reclaim reads one more, through observe).
func (d *Daemon) observeSample(ctx context.Context, kernels []attribution.Kernel) (attribution.Observation, error) {
	trees, ok := d.deps.Procs.(attribution.TreeScanner)
	if !ok {
		return attribution.Observe(ctx, d.deps.GPUs, d.deps.Procs, kernels)
	}
	obs, err := attribution.ObserveTrees(ctx, d.deps.GPUs, trees, kernels, &d.sampling.memo)
	if err != nil {
		return obs, err
	}
	for _, k := range kernels {
		if k.PID <= 0 {
			continue
		}
		if p, ok := obs.Table.Lookup(k.PID, k.StartTime); !ok || p.Exited() {
			return attribution.ObserveSnapshot(obs.Snapshot, d.deps.Procs, kernels)
		}
	}
	return obs, nil
}
