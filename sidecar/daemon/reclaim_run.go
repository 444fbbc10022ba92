package daemon

import (
	"context"
	"errors"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// startReclaim ends, in the background, the processes recorded in a dead
// kernel process's tree that are still alive and hold GPU memory (see
// reclaimPolicy). why is "restart" or "shutdown", for the log.
func (d *Daemon) startReclaim(ctx context.Context, ks *kernelState, recorded map[procID]recordedProc, why string) {
	if len(recorded) == 0 {
		return
	}
	d.wg.Add(1)
	d.reclaims.add()
	go func() {
		defer d.wg.Done()
		defer d.reclaims.done()
		d.reclaim(ctx, ks, recorded, why)
	}()
}

func (d *Daemon) reclaim(ctx context.Context, ks *kernelState, recorded map[procID]recordedProc, why string) {
	// Fresh figures: act only on what holds GPU memory now.
	obs, err := d.observe(ctx)
	if err != nil {
		d.log.Warn().Err(err).Str("kernel_id", ks.id).Msg("reclaim: nothing done")
		return
	}
	held := attribution.BytesByPID(obs.Snapshot)
	table := obs.Table
	d.mu.Lock()
	keep := d.liveKernelTreesLocked(table)
	notebook := ks.notebook
	d.mu.Unlock()
	var pod string
	var podOf func(procID) (string, error)
	if d.podKernels != nil {
		podOf = d.podOfProcess
		if ks.pod != nil {
			pod = ks.pod.UID
		}
	}
	policy := reclaimPolicy{
		selfUID:  d.selfUID,
		allUsers: d.cfg.ReclaimAllUsers && d.selfUID == 0,
		keep:     keep,
		pod:      pod,
		podOf:    podOf,
		gpuHolder: func(pid int) (uint64, bool) {
			b, ok := held[pid]
			return b, ok
		},
	}
	var ended int
	var endedBytes uint64
	defer func() { d.recordReclaim(ks, notebook, why, ended, endedBytes) }()
	for _, dec := range policy.decide(recorded, table) {
		log := d.log.With().Str("kernel_id", ks.id).Str("notebook", notebook).Int("pid", dec.ID.PID).
			Str("argv", dec.Argv).Uint64("bytes", dec.Bytes).Str("after", why).Logger()
		if !dec.Kill {
			log.Info().Str("reason", dec.Reason).Msg("orphan holds GPU memory; left alone")
			continue
		}
		if !d.cfg.Reclaim {
			log.Warn().Msg("orphan holds GPU memory; would end it (--reclaim=false)")
			continue
		}
		log.Warn().Dur("grace", d.cfg.ReclaimGrace).Msg("ending orphan that holds GPU memory (SIGTERM)")
		killed, err := d.terminate(ctx, dec.ID.PID, dec.ID.Start, d.cfg.ReclaimGrace)
		switch {
		case errors.Is(err, errStale):
			log.Info().Msg("pid was reused by another process; left alone")
		case err != nil:
			log.Warn().Err(err).Msg("could not end orphan")
		default:
			d.metrics.AddReclaimed(1, dec.Bytes)
			ended, endedBytes = ended+1, endedBytes+dec.Bytes
			if killed {
				log.Warn().Msg("orphan ignored SIGTERM; killed (SIGKILL)")
			} else {
				log.Info().Msg("orphan ended")
			}
		}
	}
}
