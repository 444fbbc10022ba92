package daemon

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"time"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// startReclaim ends, in the background, the processes recorded in a dead
// kernel process's tree that are still alive, hold GPU memory (see
// reclaimPolicy) and compute nothing (see ComputeConfig.mayEnd), after
// watching them for the grace window. why is "restart" or "shutdown", for
// the log.
func (d *Daemon) startReclaim(ctx context.Context, ks *kernelState, recorded map[procID]recordedProc, why string) {
	if len(recorded) == 0 {
		return
	}
	exitedAt := time.Now()
	d.wg.Add(1)
	d.reclaims.add()
	go func() {
		defer d.wg.Done()
		defer d.reclaims.done()
		// The grace window: the samples go on meanwhile, so that a job
		// that computes now, or starts to, is seen doing it.
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.reclaimWatch()):
		}
		d.reclaim(ctx, ks, recorded, why, exitedAt)
	}()
}

// exitReasonLocked says whether a kernel whose process exited was
// restarted ("restart": its connection file is there for the next process)
// or shut down ("shutdown"). A scan believes a missing file only
// missingGrace after it first misses it, and the exit can come first: so
// the file itself is looked at, and only its absence (not a failed read)
// says shutdown. A pod kernel's file is no path of ours: the scan decides.
func exitReasonLocked(ks *kernelState) string {
	if ks.fileGone {
		return "shutdown"
	}
	if ks.pod == nil {
		if _, err := os.Stat(ks.connFile); errors.Is(err, fs.ErrNotExist) {
			return "shutdown"
		}
	}
	return "restart"
}

// policyFor is reclaim's policy for a dead kernel of pod ("" outside any)
// over table, with the GPU memory held now.
func (d *Daemon) policyFor(pod string, table *procs.Table, held map[int]uint64) reclaimPolicy {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.policyLocked(pod, table, held, nil)
}

// policyLocked is reclaim's policy over table with the GPU memory held
// now, for the processes recorded in a tree of pod ("" outside any): every
// live kernel's tree but live's is kept. A dead kernel's survivors (live
// nil) may be the daemon's user's (any user's as root with
// --reclaim-all-users); a live kernel's workers only its user's, its own
// process kept. Called with d.mu held.
func (d *Daemon) policyLocked(pod string, table *procs.Table, held map[int]uint64, live *kernelState) reclaimPolicy {
	policy := reclaimPolicy{
		selfUID:  d.selfUID,
		allUsers: d.cfg.ReclaimAllUsers && d.selfUID == 0,
		keep:     d.kernelTreesLocked(table, live),
		gpuHolder: func(pid int) (uint64, bool) {
			b, ok := held[pid]
			return b, ok
		},
	}
	if live != nil {
		policy.selfUID, policy.allUsers = live.uid, false
		policy.keep[live.cur] = true
	}
	if d.deps.PodKernels != nil {
		policy.pod, policy.podOf = pod, d.podOfProcess
	}
	return policy
}

func (d *Daemon) reclaim(ctx context.Context, ks *kernelState, recorded map[procID]recordedProc, why string, exitedAt time.Time) {
	// Fresh figures: act only on what holds GPU memory now.
	obs, err := d.observe(ctx)
	if err != nil {
		d.log.Warn().Err(err).Str("kernel_id", ks.id).Msg("reclaim: nothing done")
		return
	}
	now := time.Now()
	d.compute.record(now, obs.Snapshot, obs.Table)
	held := attribution.BytesByPID(obs.Snapshot)
	table := obs.Table
	d.mu.Lock()
	notebook := ks.notebook
	if why == "restart" { // the scan may have seen the file go since the exit
		why = exitReasonLocked(ks)
	}
	d.mu.Unlock()
	pod := ""
	if ks.pod != nil {
		pod = ks.pod.UID
	}
	policy := d.policyFor(pod, table, held)
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
		j := d.compute.judge(dec.ID, exitedAt.Add(-d.cfg.Compute.Window), now)
		if ok, reason := d.cfg.Compute.mayEnd(j); !ok {
			d.leaveRunning(ks, notebook, pod, dec, j, reason, obs)
			continue
		}
		if !d.cfg.Reclaim {
			log.Warn().Msg("orphan holds GPU memory; would end it (--reclaim=false)")
			continue
		}
		log.Warn().Dur("grace", d.cfg.ReclaimGrace).Msg("ending orphan that holds GPU memory (SIGTERM)")
		switch out := d.endProcess(ctx, dec.ID); {
		case out.stale:
			log.Info().Msg("pid was reused by another process; left alone")
		case out.err != nil:
			log.Warn().Err(out.err).Msg("could not end orphan")
		default:
			d.metrics.AddReclaimed(1, dec.Bytes)
			ended, endedBytes = ended+1, endedBytes+dec.Bytes
			if out.killed {
				log.Warn().Msg("orphan ignored SIGTERM; killed (SIGKILL)")
			} else {
				log.Info().Msg("orphan ended")
			}
		}
	}
}
