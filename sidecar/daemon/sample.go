package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gpumem/gpumem/protocol"
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

// observe reads the GPUs and /proc once, for the kernels followed now.
func (d *Daemon) observe(ctx context.Context) (attribution.Observation, error) {
	d.mu.Lock()
	kernels := d.kernelsLocked()
	d.mu.Unlock()
	obs, err := attribution.Observe(ctx, d.gpus, d.fs, kernels)
	if err == nil {
		d.flagStray(&obs.Report)
	}
	return obs, err
}

// sample reads NVML and /proc once: it records each live kernel's tree,
// retires kernel processes that have exited (reclaiming their trees),
// keeps the report, and raises alerts.
func (d *Daemon) sample(ctx context.Context) {
	start := time.Now()
	// The process each kernel had when /proc is read: scans run beside
	// samples, and a kernel a scan follows (or whose process it proves)
	// after that read is judged at the next sample, not by a table that
	// may predate its process.
	d.mu.Lock()
	kernels := d.kernelsLocked()
	seen := make(map[*kernelState]procID, len(d.kernels))
	for _, ks := range d.kernels {
		seen[ks] = ks.cur
	}
	d.mu.Unlock()
	obs, err := d.observeSample(ctx, kernels)
	if d.afterObserve != nil {
		d.afterObserve()
	}
	if err != nil {
		d.log.Warn().Err(err).Msg("sampling failed")
		d.mu.Lock()
		d.last.SampleSuccess = false
		d.mu.Unlock()
		return
	}

	type job struct {
		ks       *kernelState
		recorded map[procID]recordedProc
		why      string
	}
	var jobs []job
	var unknown []*kernelState
	d.mu.Lock()
	for file, ks := range d.kernels {
		if cur, ok := seen[ks]; !ok || cur != ks.cur {
			continue
		}
		if !ks.cur.isZero() && !ks.observe(obs.Table) && d.confirmExitLocked(ks) {
			// The kernel process is gone: its old tree's survivors are
			// orphans. With the file still there a new process serves it
			// (a restart); without, the kernel was shut down.
			why := "restart"
			if ks.fileGone {
				why = "shutdown"
				delete(d.kernels, file)
			}
			d.log.Info().Str("kernel_id", ks.id).Str("notebook", ks.notebook).Int("pid", ks.cur.PID).
				Str("after", why).Msg("kernel process exited")
			jobs = append(jobs, job{ks, ks.takeRecordedLocked(), why})
			ks.cur = procID{}
		}
		if ks.cur.isZero() && !ks.fileGone {
			unknown = append(unknown, ks)
		}
	}
	rep := obs.Report
	retired := len(jobs) > 0
	if retired { // the retired kernels' processes are no longer theirs
		rep = attribution.MakeReport(obs.Snapshot, obs.Table, d.kernelsLocked())
	}
	d.mu.Unlock()
	if retired {
		d.flagStray(&rep)
	}

	for _, j := range jobs {
		d.startReclaim(ctx, j.ks, j.recorded, j.why)
	}
	if len(unknown) > 0 {
		d.resolveKernelProcesses(ctx, unknown)
	}

	attribution.AddPods(&rep, obs.Table, d.pods)
	d.finishCompute(time.Now(), &rep, obs)
	culls := d.cull(ctx, &rep)
	sampledAt := d.recordHistory(time.Now(), &rep)
	d.ooms.annotate(&rep)
	elapsed := time.Since(start)
	d.mu.Lock()
	attached := 0
	for _, ks := range d.kernels {
		if ks.client != nil {
			attached++
		}
	}
	d.sampleSeq++ // a new report: the encoded one is stale
	d.last = metrics.Snapshot{Report: rep, AttachedKernels: attached, SampleDuration: elapsed,
		SampleSuccess: true, SampledAt: time.Now(), AlertThreshold: d.cfg.AlertThreshold}
	d.mu.Unlock()
	d.historySampled(sampledAt)
	d.checkAlerts(rep, culls)
}

// confirmExitLocked looks at the kernel process that the sample's table
// lacks (or shows a zombie), on its own: only /proc saying that it is gone,
// its pid reused or it a zombie retires the kernel and sends its tree to
// reclaim. A process that cannot
// be looked at now (out of descriptors, memory) is kept, and said so.
// Called with d.mu held: one stat read.
func (d *Daemon) confirmExitLocked(ks *kernelState) bool {
	gone, err := d.fs.Exited(ks.cur.PID, ks.cur.Start)
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
	owners, err := d.finder.FindKernels(files)
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

// liveKernelTrees is every process in the tree of a live kernel process we
// know: never reclaimed.
func (d *Daemon) liveKernelTreesLocked(table *procs.Table) map[procID]bool {
	return d.kernelTreesLocked(table, nil)
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
