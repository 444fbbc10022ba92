package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/metrics"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// kernelsLocked lists the kernels followed, for attribution. Called with
// d.mu held.
func (d *Daemon) kernelsLocked() []attribution.Kernel {
	kernels := make([]attribution.Kernel, 0, len(d.kernels))
	for _, ks := range d.kernels {
		kernels = append(kernels, attribution.Kernel{ID: ks.id, ConnectionFile: ks.connFile, Notebook: ks.notebook,
			PID: ks.cur.PID, StartTime: ks.cur.Start})
	}
	return kernels
}

// observe reads the GPUs and /proc once, for the kernels followed now: the
// join, for decisions on processes; finishNow makes a report of it.
func (d *Daemon) observe(ctx context.Context) (attribution.Observation, error) {
	d.mu.Lock()
	kernels := d.kernelsLocked()
	d.mu.Unlock()
	return attribution.Observe(ctx, d.deps.GPUs, d.deps.Procs, kernels)
}

// tick is one sample's work in progress, handed from step to step.
type tick struct {
	start   time.Time
	kernels []attribution.Kernel
	// seen is the process each kernel had when /proc was read.
	seen map[*kernelState]procID
	obs  attribution.Observation
	rep  attribution.Report
	// retired are the kernels whose process exited, with their trees.
	retired []retiredKernel
	// unknown are kernels whose process is not known.
	unknown []*kernelState
	// culls are the cull warnings that stand, activity what each kernel's
	// server says of it.
	culls    []attribution.CullWarning
	activity map[string]attribution.KernelActivity
	// crossed are the GPUs whose used memory crossed the alert threshold
	// (true: up, false: back down) at this sample.
	crossed map[int]bool
	// compute is what the readings of GPU work judged, peaks each
	// notebook's peak: Finish's inputs.
	compute *attribution.ComputeFacts
	peaks   map[string]uint64
	// finished is what the report was finished with, kept for the
	// readings taken between samples (finishNow).
	finished attribution.FinishInput
	// sampledAt is when history recorded the sample.
	sampledAt int64
	steps     []metrics.StepTiming
}

// retiredKernel is a kernel whose process exited, and the tree to reclaim.
type retiredKernel struct {
	ks       *kernelState
	recorded map[procID]recordedProc
	why      string
}

// sampleStep is one named step of a sample: run in order, each timed and
// its failure logged (node_exporter's collectors run the same way). A
// required step that fails ends the sample: those after it need what it
// makes. Another's failure is reported by the step itself (d.problem,
// which limits repeats) and the sample goes on.
type sampleStep struct {
	name     string
	run      func(context.Context, *tick) error
	required bool
}

// sampleSteps are a sample's steps, in order.
func (d *Daemon) sampleSteps() []sampleStep {
	return []sampleStep{
		{name: "observe", run: d.stepObserve, required: true},
		{name: "retire", run: d.stepRetire},
		{name: "resolve", run: d.stepResolve},
		{name: "compute", run: d.stepCompute},
		{name: "cull", run: d.stepCull},
		{name: "history", run: d.stepHistory},
		{name: "finish", run: d.stepFinish},
		{name: "alerts", run: d.stepAlerts},
		{name: "publish", run: d.stepPublish},
	}
}

// sample reads NVML and /proc once and runs every step on that reading.
func (d *Daemon) sample(ctx context.Context) {
	t := &tick{start: time.Now()}
	for _, s := range d.sampleSteps() {
		began := time.Now()
		err := s.run(ctx, t)
		t.steps = append(t.steps, metrics.StepTiming{Step: s.name, Duration: time.Since(began), Success: err == nil})
		switch {
		case err != nil && !s.required:
			d.log.Debug().Err(err).Str("step", s.name).Msg("sample step failed")
		case err != nil:
			if log, unlogged := d.sampling.failures.fail(time.Now(), s.name+": "+err.Error()); log {
				d.log.Warn().Err(err).Str("step", s.name).Int("unlogged_since", unlogged).Msg("sampling failed")
			}
			d.mu.Lock()
			d.pub.last.SampleSuccess = false
			d.pub.last.Steps = t.steps
			d.mu.Unlock()
			return
		}
	}
	if n := d.sampling.failures.ok(); n > 0 {
		d.log.Info().Int("failures", n).Msg("sampling works again")
	}
	d.mu.Lock()
	d.pub.last.Steps = t.steps // publish's own time too
	d.mu.Unlock()
}

// stepObserve reads the GPUs and /proc for the kernels followed now.
func (d *Daemon) stepObserve(ctx context.Context, t *tick) error {
	// The process each kernel had when /proc is read: scans run beside
	// samples, and a kernel a scan follows (or whose process it proves)
	// after that read is judged at the next sample, not by a table that
	// may predate its process.
	d.mu.Lock()
	t.kernels = d.kernelsLocked()
	t.seen = make(map[*kernelState]procID, len(d.kernels))
	for _, ks := range d.kernels {
		t.seen[ks] = ks.cur
	}
	d.mu.Unlock()
	obs, err := d.observeSample(ctx, t.kernels)
	if d.sampling.afterObserve != nil {
		d.sampling.afterObserve()
	}
	t.obs, t.rep = obs, obs.Report
	return err
}

// stepRetire retires kernel processes that have exited (only once /proc
// confirms it) and hands their trees to reclaim.
func (d *Daemon) stepRetire(ctx context.Context, t *tick) error {
	d.mu.Lock()
	for file, ks := range d.kernels {
		if cur, ok := t.seen[ks]; !ok || cur != ks.cur {
			continue
		}
		if !ks.cur.isZero() && !ks.observe(t.obs.Table) && d.confirmExitLocked(ks) {
			// The kernel process is gone: its old tree's survivors are
			// orphans. With the file still there a new process serves it
			// (a restart); without, the kernel was shut down.
			why := exitReasonLocked(ks)
			if ks.fileGone {
				delete(d.kernels, file)
			}
			d.log.Info().Str("kernel_id", ks.id).Str("notebook", ks.notebook).Int("pid", ks.cur.PID).
				Str("after", why).Msg("kernel process exited")
			t.retired = append(t.retired, retiredKernel{ks, ks.takeRecordedLocked(), why})
			ks.cur = procID{}
		}
		if ks.cur.isZero() && !ks.fileGone {
			t.unknown = append(t.unknown, ks)
		}
	}
	if len(t.retired) > 0 { // the retired kernels' processes are no longer theirs
		t.rep = attribution.MakeReport(t.obs.Snapshot, t.obs.Table, d.kernelsLocked())
	}
	d.mu.Unlock()
	for _, r := range t.retired {
		d.startReclaim(ctx, r.ks, r.recorded, r.why)
	}
	return nil
}

// stepResolve finds the process of the kernels whose process is not known.
func (d *Daemon) stepResolve(ctx context.Context, t *tick) error {
	if len(t.unknown) > 0 {
		d.resolveKernelProcesses(ctx, t.unknown)
	}
	return nil
}

// stepCompute records the reading's GPU work and judges it: compute
// verdicts, hoarding and processes left running, for Finish.
func (d *Daemon) stepCompute(_ context.Context, t *tick) error {
	t.compute = d.judgeSample(time.Now(), &t.rep, t.obs)
	return nil
}

// stepCull runs culling's policy over the kernels (starting the actions
// due) and gathers what each kernel's server says of it.
func (d *Daemon) stepCull(ctx context.Context, t *tick) error {
	t.culls, t.activity = d.cull(ctx, t.rep, t.compute)
	return nil
}

// stepFinish finishes the report (attribution.Finish) with the sample's
// judgements: compute, peaks, culls, activity, OOM summaries, stray
// evidence, and the threshold's episodes.
func (d *Daemon) stepFinish(_ context.Context, t *tick) error {
	in := attribution.FinishInput{Table: t.obs.Table, Pods: d.deps.Pods, Evidence: d.strayEvidence(t.rep),
		OOM: d.ooms.summaries(t.rep), Kernels: t.activity, Culls: t.culls, Compute: t.compute, Peaks: t.peaks}
	d.mu.Lock()
	t.crossed, in.Alerts = d.crossThresholdLocked(t.rep)
	if !d.pub.last.SampledAt.IsZero() {
		last := d.pub.last.Report // a published report's slices are never modified
		in.Previous = &last
	}
	d.mu.Unlock()
	in.Now = time.Now()
	attribution.Finish(&t.rep, in)
	t.finished = in
	return nil
}

// crossThresholdLocked notes which GPUs of rep crossed the alert threshold
// since the last sample (true: up, false: back down), counting each
// crossing up as an episode, and gives the alerts' configuration. Called
// with d.mu held.
func (d *Daemon) crossThresholdLocked(rep attribution.Report) (map[int]bool, attribution.AlertConfig) {
	crossed := map[int]bool{}
	episodes := map[int]int{}
	for _, g := range rep.GPUs {
		if d.cfg.AlertThreshold <= 0 {
			break
		}
		over := attribution.OverThreshold(g, d.cfg.AlertThreshold)
		was := d.alerts.over[g.Index]
		d.alerts.over[g.Index] = over
		if over && !was {
			d.alerts.episodes[g.Index]++
		}
		if over != was {
			crossed[g.Index] = over
		}
		episodes[g.Index] = d.alerts.episodes[g.Index]
	}
	return crossed, attribution.AlertConfig{Threshold: d.cfg.AlertThreshold, Episodes: episodes,
		NameUsers: d.cfg.SocketMode == api.ModeShared}
}

// finishNow finishes a reading taken now, outside the samples, as a sample
// is finished: with the last sample's judgements (compute, peaks, culls,
// activity) and the evidence and OOM summaries known now, so that a row
// read now has a sampled row's shape. Its stray flags stand at once, as a
// single report's do.
func (d *Daemon) finishNow(obs attribution.Observation) attribution.Report {
	d.mu.Lock()
	in := d.pub.finished
	d.mu.Unlock()
	in.Now, in.Table, in.Previous, in.Pods = time.Now(), obs.Table, nil, d.deps.Pods
	in.Evidence, in.OOM = d.strayEvidence(obs.Report), d.ooms.summaries(obs.Report)
	rep := obs.Report
	attribution.Finish(&rep, in)
	return rep
}

// stepHistory adds the joined report's figures to the history and reads
// each notebook's peak, for Finish.
func (d *Daemon) stepHistory(_ context.Context, t *tick) error {
	t.sampledAt, t.peaks = d.recordHistory(time.Now(), &t.rep)
	return nil
}

// stepAlerts logs the threshold's crossings and keeps the notebook alert
// file current.
func (d *Daemon) stepAlerts(_ context.Context, t *tick) error {
	d.logCrossings(t.rep, t.crossed)
	if d.notebookAlerts() {
		return d.writeAlerts(t.rep)
	}
	return nil
}

// stepPublish makes the report the one every face reads, and wakes the
// history requests that wait for it.
func (d *Daemon) stepPublish(_ context.Context, t *tick) error {
	d.mu.Lock()
	attached := 0
	for _, ks := range d.kernels {
		if ks.client != nil {
			attached++
		}
	}
	elapsed := time.Since(t.start)
	d.pub.seq++ // a new report: the encoded one is stale
	d.pub.last = metrics.Snapshot{Report: t.rep, AttachedKernels: attached, SampleDuration: elapsed,
		SampleSuccess: true, SampledAt: time.Now(), AlertThreshold: d.cfg.AlertThreshold, Steps: t.steps}
	d.pub.finished = t.finished
	d.mu.Unlock()
	d.historySampled(t.sampledAt)
	return nil
}

// confirmExitLocked looks at the kernel process that the sample's table
// lacks (or shows a zombie), on its own: only /proc saying that it is gone,
// its pid reused or it a zombie retires the kernel and sends its tree to
// reclaim. A process that cannot
// be looked at now (out of descriptors, memory) is kept, and said so.
// Called with d.mu held: one stat read.
func (d *Daemon) confirmExitLocked(ks *kernelState) bool {
	gone, err := d.deps.Procs.Exited(ks.cur.PID, ks.cur.Start)
	switch {
	case err != nil:
		d.problem(fmt.Errorf("kernel %s: its process %d is missing from the scan of /proc and cannot be looked at (%w): "+
			"not taken for an exit, its processes are left alone", ks.id, ks.cur.PID, err))
		return false
	case !gone:
		d.log.Warn().Str("kernel_id", ks.id).Int("pid", ks.cur.PID).
			Msg("kernel process missing from the scan of /proc but alive: not taken for an exit")
		return false
	}
	return true
}

// resolveKernelProcesses finds the process of kernels whose process is not
// known (new, or restarted). Only a proven one is taken (see
// discovery.ProcFinder.FindKernels); a port owner that runs as the file's
// owner but names the file nowhere (a wrapper passing it otherwise) is
// taken once it answers a request signed with the file's key.
func (d *Daemon) resolveKernelProcesses(ctx context.Context, kss []*kernelState) {
	var files []discovery.KernelFile
	byPath := map[string]*kernelState{}
	d.mu.Lock()
	for _, ks := range kss {
		if ks.client == nil || ks.proving || ks.pod != nil {
			continue // a pod kernel's process is proven by the scan
		}
		if info := ks.client.Info(); info.Transport == "tcp" {
			files = append(files, discovery.KernelFile{Name: filepath.Base(ks.connFile), Path: ks.connFile, IP: info.IP,
				ShellPort: info.ShellPort, UID: ks.fileUID, ID: ks.fileID})
			byPath[ks.connFile] = ks
		}
	}
	d.mu.Unlock()
	if len(files) == 0 {
		return
	}
	owners, err := d.deps.Finder.FindKernels(files)
	if err != nil {
		d.log.Debug().Err(err).Msg("resolving kernel processes")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for path, o := range owners {
		ks := byPath[path]
		switch {
		case ks == nil || !o.FromPort:
		case o.Proven:
			d.setKernelProcessLocked(ks, procID{o.PID, o.Start})
		case o.UIDMatch && ks.client != nil:
			ks.proving = true
			d.wg.Add(1)
			go func() { defer d.wg.Done(); d.proveByKey(ctx, ks, ks.client, procID{o.PID, o.Start}) }()
		default:
			d.problem(fmt.Errorf("kernel connection file %s: not counted as a kernel: %s", ks.connFile, o.Why))
		}
	}
}

// proveByKey takes id as ks's process when the kernel answers kernel_info
// (on control: answered even while a cell runs) with a reply signed with the
// file's key, and id still owns the port afterwards.
func (d *Daemon) proveByKey(ctx context.Context, ks *kernelState, c *protocol.Client, id procID) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := c.KernelInfo(rctx)
	cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	ks.proving = false
	if err != nil {
		d.problem(fmt.Errorf("kernel connection file %s: pid %d serves its port but names it nowhere, "+
			"and no reply signed with its key came (%v): not counted as a kernel", ks.connFile, id.PID, err))
		return
	}
	d.log.Info().Str("kernel_id", ks.id).Int("pid", id.PID).Msg("kernel process proven by a reply signed with its key")
	d.setKernelProcessLocked(ks, id)
}

// kernelTreesLocked is every process in the tree of a live kernel process
// we know but except's.
func (d *Daemon) kernelTreesLocked(table *procs.Table, except *kernelState) map[procID]bool {
	keep := map[procID]bool{}
	for _, ks := range d.kernels {
		if ks.cur.isZero() || ks == except {
			continue
		}
		for _, p := range table.KernelProcesses(ks.cur.PID, ks.cur.Start) {
			keep[procID{p.PID, p.StartTime}] = true
		}
	}
	return keep
}
