package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/history"
)

// reclaimWatch is the grace window: how long a dead kernel's survivors are
// watched before reclaim decides, long enough for the readings that can
// call a process idle.
func (d *Daemon) reclaimWatch() time.Duration {
	return max(d.cfg.ReclaimGrace, computeMinKnown*d.cfg.Interval)
}

// leaveRunning records that reclaim left process dec running: a log line,
// the count, the report's list and an event (the notebook's JupyterLab
// shows it, with an action that ends it).
func (d *Daemon) leaveRunning(ks *kernelState, notebook, pod string, dec decision, j judgement, reason string, obs attribution.Observation) {
	var gpus []int
	for _, dev := range obs.Snapshot.Devices {
		for _, p := range dev.Processes {
			if p.PID == dec.ID.PID && !slices.Contains(gpus, dev.Index) {
				gpus = append(gpus, dev.Index)
			}
		}
	}
	user := ""
	if p, ok := obs.Table.Lookup(dec.ID.PID, dec.ID.Start); ok {
		user = p.User
	}
	state := attribution.ComputeComputing
	if j.verdict != verdictComputing {
		state = attribution.ComputeUnknown
	}
	lr := &leftRunning{id: dec.ID, uid: dec.UID, pod: pod, LeftRunning: attribution.LeftRunning{
		KernelID: ks.id, ConnectionFile: ks.connFile, Notebook: notebook, User: user, PID: dec.ID.PID, StartTime: dec.ID.Start,
		Command: dec.Argv, GPUs: gpus, Bytes: dec.Bytes, Reason: state, Since: time.Now(),
	}}
	lr.Message = leftRunningMessage(lr.LeftRunning, j.why())
	d.compute.addLeftRunning(lr)
	d.metrics.AddLeftRunning(state)
	d.log.Warn().Str("kernel_id", ks.id).Str("connection_file", ks.connFile).Str("notebook", notebook).Int("pid", dec.ID.PID).Str("argv", dec.Argv).
		Uint64("bytes", dec.Bytes).Ints("gpus", gpus).Str("reason", reason).Msg("orphan left running: " + state)
	d.hist.events.Add(history.Event{Time: time.Now().Unix(), Kind: "left_running", KernelID: ks.id, ConnectionFile: ks.connFile, Notebook: notebook,
		User: user, Reason: state, Processes: 1, Bytes: dec.Bytes, PID: dec.ID.PID, StartTime: dec.ID.Start, Message: lr.Message})
}

// leftRunningMessage is the sentence every face shows for a process left
// running: "a job started from train.ipynb (pid 4242, `python train.py`)
// is still computing on GPU 0 with 20.0 GiB: left running".
func leftRunningMessage(lr attribution.LeftRunning, why string) string {
	from := attribution.KernelName(lr.Notebook, lr.KernelID)
	cmd := lr.Command
	if r := []rune(cmd); len(r) > 60 {
		cmd = string(r[:59]) + "…"
	}
	on := "a GPU"
	if len(lr.GPUs) == 1 {
		on = fmt.Sprintf("GPU %d", lr.GPUs[0])
	} else if len(lr.GPUs) > 1 {
		s := make([]string, len(lr.GPUs))
		for i, g := range lr.GPUs {
			s[i] = fmt.Sprint(g)
		}
		on = "GPUs " + strings.Join(s, ", ")
	}
	job := fmt.Sprintf("a job started from %s (pid %d, `%s`)", from, lr.PID, cmd)
	if lr.Reason == attribution.ComputeComputing {
		return fmt.Sprintf("%s is still computing on %s with %s: left running", job, on, units.Bytes(lr.Bytes))
	}
	return fmt.Sprintf("%s holds %s on %s and whether it computes is unknown (%s): left running", job, units.Bytes(lr.Bytes), on, why)
}

// EndOrphans implements api.Backend: processes left running of the
// kernel of k's connection file (never another of the same id), recorded
// as user's (any for ""), ended on request (the API checked who asks),
// each checked as reclaim checks it now: alive with its recorded start
// time (through a pidfd), holding GPU memory, in no live kernel's tree, of
// a user the daemon may end, in the kernel's pod.
func (a apiBackend) EndOrphans(ctx context.Context, k api.KernelRef, user string, req api.EndOrphansRequest) (api.EndOrphansReply, error) {
	d := a.d
	kernelID := k.ID
	reply := api.EndOrphansReply{KernelID: kernelID, Processes: []api.EndedProcess{}}
	var left []leftRunning
	for _, lr := range d.compute.leftRunningOf(k.ConnectionFile) {
		if user == "" || lr.User == user {
			left = append(left, lr)
		}
	}
	if len(left) == 0 {
		return reply, fmt.Errorf("kernel %s: no process of its tree is left running: %w", kernelID, api.ErrKernelNotFound)
	}
	chosen := left
	if len(req.PIDs) > 0 {
		chosen = nil
		for _, pid := range req.PIDs {
			i := slices.IndexFunc(left, func(lr leftRunning) bool { return lr.PID == pid })
			if i < 0 {
				reply.Processes = append(reply.Processes, api.EndedProcess{PID: pid,
					Reason: "not a process gpumem left running for this kernel: nothing done"})
				continue
			}
			chosen = append(chosen, left[i])
		}
	}
	if len(chosen) == 0 {
		return reply, nil
	}
	obs, err := d.observe(ctx)
	if err != nil {
		return reply, fmt.Errorf("reading the GPUs and processes: %w", err)
	}
	held := attribution.BytesByPID(obs.Snapshot)
	for _, lr := range chosen {
		out := api.EndedProcess{PID: lr.PID, Bytes: held[lr.PID]}
		log := d.log.With().Str("kernel_id", kernelID).Str("connection_file", k.ConnectionFile).Str("notebook", lr.Notebook).Int("pid", lr.PID).
			Str("argv", lr.Command).Uint64("bytes", out.Bytes).Logger()
		decisions := d.policyFor(lr.pod, obs.Table, held).decide(map[procID]recordedProc{lr.id: {UID: lr.uid, Argv: lr.Command}}, obs.Table)
		switch {
		case len(decisions) == 0:
			out.Reason = "exited, or holds no GPU memory any more: nothing done"
			d.compute.forgetLeftRunning(lr.id)
		case !decisions[0].Kill:
			out.Reason = decisions[0].Reason
		default:
			log.Warn().Dur("grace", d.cfg.ReclaimGrace).Msg("ending a process left running, on request (SIGTERM)")
			switch end := d.endProcess(ctx, lr.id); {
			case end.stale:
				out.Reason = "its pid now names another process: nothing done"
				d.compute.forgetLeftRunning(lr.id)
			case end.err != nil:
				out.Reason = end.err.Error()
			default:
				out.Ended, out.Killed = true, end.killed
				d.compute.forgetLeftRunning(lr.id)
				d.metrics.AddReclaimed(1, out.Bytes)
				log.Info().Bool("killed", end.killed).Msg("process left running ended on request")
			}
		}
		if !out.Ended {
			log.Info().Str("reason", out.Reason).Msg("process left running: not ended")
		}
		reply.Processes = append(reply.Processes, out)
	}
	d.sampleSoon()
	return reply, nil
}
