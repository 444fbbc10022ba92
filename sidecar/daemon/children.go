package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// FreeChildren implements api.Backend: it ends the processes of a live
// kernel's tree that hold GPU memory, never the kernel itself, under
// reclaim's policy (planChildren): recorded in this kernel's tree, still
// alive with the same start time (signalled through a pidfd), of the
// kernel's user, in its pod, in no other live kernel's tree, and idle by
// its own readings over the compute window; a worker that computes, or
// whose work is unknown, is left running and named, unless its pid is
// confirmed (req.PIDs: then only those are ended). The frameworks' own
// teardown (DataLoader workers, pools, ray, inference engines) runs first
// when nothing forbids it (childrenTeardownSkipped): it ends every worker
// it knows. The report says what ended, how, what was left and why, and
// the driver's figure before and after (read once the ended processes are
// gone from its list).
func (a apiBackend) FreeChildren(ctx context.Context, k api.KernelRef, fromKernel bool, req api.FreeChildrenRequest) (json.RawMessage, error) {
	d := a.d
	client, err := d.attachedClient(k)
	if err != nil {
		return nil, err
	}
	// The kernel ran its teardown before asking, unless pids are
	// confirmed (then it runs none).
	kernelTorn := fromKernel && len(req.PIDs) == 0
	before, err := d.childrenFiguresBefore(ctx, k, kernelTorn)
	if err != nil {
		return nil, err
	}
	busy := d.kernelBusy(k)
	sv, err := d.surveyChildren(ctx, k, req.PIDs)
	if err != nil {
		return nil, err
	}
	report := map[string]any{}
	var notes []string
	torn := kernelTorn
	if !fromKernel {
		if why := childrenTeardownSkipped(busy, req.PIDs, sv.plans); why != "" {
			notes = append(notes, why)
		} else {
			d.runTeardown(ctx, client, k, report)
			torn = true
			if sv, err = d.surveyChildren(ctx, k, nil); err != nil {
				return nil, err
			}
		}
	}
	// The kernel's teardown report says what it ran; what the report is
	// of, and every figure below, is the daemon's.
	report["kind"], report["schema"], report["kernel_id"] = "children", 1, k.ID
	var ended []magics.ChildOutcome
	if torn {
		ended = endedByTeardown(before, sv)
	}
	byPolicy, left := d.carryOutChildren(ctx, k, sv, knownNames(report))
	ended = append(ended, byPolicy...)
	for _, pid := range sv.notFound {
		left = append(left, magics.ChildOutcome{PID: pid,
			Reason: "not a process of this kernel's tree that holds GPU memory (nor the kernel itself): nothing done"})
	}
	slices.SortFunc(ended, func(a, b magics.ChildOutcome) int { return a.PID - b.PID })
	after, note := d.childrenFiguresAfter(ctx, k, ended, before)
	if note != "" {
		notes = append(notes, note)
	}
	report["ended"], report["left"] = nonNilOutcomes(ended), nonNilOutcomes(left)
	report["before"], report["after"] = before.GPUMemoryBytes, after.GPUMemoryBytes
	report["returned_bytes"] = subSat(before.GPUMemoryBytes, after.GPUMemoryBytes)
	if len(notes) > 0 {
		report["notes"] = notes
	}
	d.sampleSoon()
	if fromKernel {
		return json.Marshal(report) // the kernel renders it with what it knows of its children
	}
	if busy {
		// The kernel would render it only after its running cell.
		return json.Marshal(report)
	}
	rctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	raw, err := magics.Render(rctx, client, report)
	if err != nil {
		// What was ended is ended: the caller hears of it anyway.
		report["notes"] = append(notes, fmt.Sprintf("the kernel did not render this report (%v): gpumem serve's account only", err))
		return json.Marshal(report)
	}
	return raw, nil
}

// childrenFiguresBefore are the kernel's figures before its teardown: read
// now or, when the kernel ran its teardown before asking, as
// ChildrenBefore read them just before it (the last sample's only when
// the kernel did not ask for that: a sample between the teardown and this
// request would miss what the teardown ended).
func (d *Daemon) childrenFiguresBefore(ctx context.Context, k api.KernelRef, kernelTorn bool) (attribution.Notebook, error) {
	if kernelTorn {
		if before, ok := d.takeChildrenBefore(k); ok {
			return before, nil
		}
		rep, err := apiBackend{d}.Report(ctx)
		if err != nil {
			return attribution.Notebook{}, err
		}
		before, _ := notebookOf(rep, k.ConnectionFile)
		return before, nil
	}
	first, err := d.observe(ctx)
	if err != nil {
		return attribution.Notebook{}, err
	}
	before, _ := notebookOf(first.Report, k.ConnectionFile)
	return before, nil
}

// kernelBusy reports whether the kernel of k runs a cell, as far as the
// daemon can tell.
func (d *Daemon) kernelBusy(k api.KernelRef) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	ks, ok := d.kernels[k.ConnectionFile]
	return ok && ks.id == k.ID && ks.shellBusy(time.Now())
}

// childrenTeardownSkipped says why the frameworks' teardown may not run
// now, or "": it ends every worker it knows, computing or not, and it runs
// in the kernel, after the cell it runs.
func childrenTeardownSkipped(busy bool, confirmed []int, plans []childPlan) string {
	const not = "the frameworks' teardown was not run: "
	switch {
	case len(confirmed) > 0:
		return not + "it ends every worker it knows, and only the pids confirmed are to be ended"
	case busy:
		return not + "the kernel is running a cell, and the teardown would run only after it"
	}
	for _, p := range plans {
		if p.confirm {
			return fmt.Sprintf(not+"it ends every worker it knows, and pid %d is left running for what it computes", p.ID.PID)
		}
	}
	return ""
}

// runTeardown has the kernel run the frameworks' teardown and puts its
// report in report.
func (d *Daemon) runTeardown(ctx context.Context, client magics.Executor, k api.KernelRef, report map[string]any) {
	tctx, cancel := context.WithTimeout(ctx, queryTimeout)
	raw, err := magics.Teardown(tctx, client)
	cancel()
	if err == nil {
		err = json.Unmarshal(raw, &report)
	}
	if err != nil {
		clear(report)
		report["teardown_errors"] = []string{fmt.Sprintf("the kernel's teardown did not run: %v", err)}
		d.log.Warn().Err(err).Str("kernel_id", k.ID).Msg("free --children: the kernel's teardown did not run")
	}
}

// knownNames are the kernel's names for its child processes, from its
// teardown report (its word).
func knownNames(report map[string]any) map[int]string {
	out := map[int]string{}
	known, _ := report["known"].(map[string]any)
	for k, v := range known {
		pid, err := strconv.Atoi(k)
		if s, ok := v.(string); ok && err == nil {
			out[pid] = s
		}
	}
	return out
}

// endedByTeardown are the processes of before (the kernel aside) that are
// gone in the survey read after the teardown.
func endedByTeardown(before attribution.Notebook, sv childSurvey) []magics.ChildOutcome {
	var ended []magics.ChildOutcome
	for _, p := range before.Processes {
		if p.PID == sv.self.PID {
			continue
		}
		if _, alive := sv.obs.Table.Get(p.PID); !alive {
			ended = append(ended, magics.ChildOutcome{PID: p.PID, Command: argvOf(sv.recorded, p.PID), Bytes: total(p.PerGPU),
				How: "ended during the frameworks' teardown"})
		}
	}
	return ended
}

// carryOutChildren ends what sv's plans end, and says what it left.
func (d *Daemon) carryOutChildren(ctx context.Context, k api.KernelRef, sv childSurvey, known map[int]string) (ended, left []magics.ChildOutcome) {
	log := d.log.With().Str("kernel_id", k.ID).Str("connection_file", k.ConnectionFile).Str("notebook", sv.notebook).Logger()
	for _, p := range sv.plans {
		out := childOutcome(p, sv.obs, known)
		if !p.Kill {
			out.Reason = p.Reason
			left = append(left, out)
			log.Info().Int("pid", p.ID.PID).Str("compute", out.Compute).Str("reason", p.Reason).Msg("free --children: left running")
			continue
		}
		switch end := d.endProcess(ctx, p.ID); {
		case end.stale:
			continue // gone, its pid reused
		case end.err != nil:
			out.Reason = end.err.Error()
			left = append(left, out)
			log.Warn().Err(end.err).Int("pid", p.ID.PID).Msg("free --children: could not end it")
			continue
		case end.killed:
			out.How = "SIGKILL (it ignored SIGTERM)"
		default:
			out.How = "SIGTERM"
		}
		ended = append(ended, out)
		log.Warn().Int("pid", p.ID.PID).Str("argv", p.Argv).Uint64("bytes", p.Bytes).Str("how", out.How).
			Str("compute", out.Compute).Msg("free --children: ended a worker process of a live kernel")
	}
	return ended, left
}

// childOutcome is what the report says of plan p's process: its GPUs and
// newest SM reading (from obs), the verdict, the kernel's name for it.
func childOutcome(p childPlan, obs attribution.Observation, known map[int]string) magics.ChildOutcome {
	out := magics.ChildOutcome{PID: p.ID.PID, Command: p.Argv, Bytes: p.Bytes, What: known[p.ID.PID], Compute: p.j.verdict.String()}
	var sm uint32
	smKnown := true
	for _, dev := range obs.Snapshot.Devices {
		for _, gp := range dev.Processes {
			tp, ok := obs.Table.Resolve(gp.PID)
			if !ok || tp.PID != p.ID.PID || tp.StartTime != p.ID.Start {
				continue
			}
			if !slices.Contains(out.GPUs, dev.Index) {
				out.GPUs = append(out.GPUs, dev.Index)
			}
			smKnown = smKnown && gp.Util.Known
			sm = max(sm, gp.Util.SMPercent)
		}
	}
	if smKnown && len(out.GPUs) > 0 {
		out.SMPercent = &sm
	}
	if p.confirm {
		out.Confirm = true
		out.Message = out.LeftMessage()
	}
	return out
}

// childrenGoneWait bounds the wait for the driver to stop listing the
// processes ended: the figure after is read once they are gone.
const childrenGoneWait = 5 * time.Second

// childrenFiguresAfter are the kernel's figures once none of ended is in
// the driver's list of its tree (an exited process's memory is released a
// moment after its exit), and a note when childrenGoneWait passed first.
func (d *Daemon) childrenFiguresAfter(ctx context.Context, k api.KernelRef, ended []magics.ChildOutcome, before attribution.Notebook) (attribution.Notebook, string) {
	deadline := time.Now().Add(childrenGoneWait)
	after := before
	for {
		obs, err := d.observe(ctx)
		if err != nil {
			return after, fmt.Sprintf("the driver's figure after could not be read (%v): it is the one before", err)
		}
		after, _ = notebookOf(obs.Report, k.ConnectionFile)
		var listed []int
		for _, p := range after.Processes {
			if slices.ContainsFunc(ended, func(o magics.ChildOutcome) bool { return o.PID == p.PID }) {
				listed = append(listed, p.PID)
			}
		}
		if len(listed) == 0 {
			return after, ""
		}
		if time.Now().After(deadline) {
			return after, fmt.Sprintf("the driver still listed pids %s %v after they were ended: the figure after may count them",
				pidList(listed), childrenGoneWait)
		}
		select {
		case <-ctx.Done():
			return after, fmt.Sprintf("the driver's figure after was read before pids %s were gone from its list (%v)", pidList(listed), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// childSurvey is the kernel's tree as free --children finds it: the
// observation, the kernel's process, its recorded tree, and the plan.
type childSurvey struct {
	obs      attribution.Observation
	self     procID
	recorded map[procID]recordedProc
	notebook string
	plans    []childPlan
	notFound []int
}

// surveyChildren reads the kernel's tree and plans it (planChildren). A
// process it would judge for want of readings alone is waited for, as
// reclaim watches a dead kernel's survivors: up to the grace window.
func (d *Daemon) surveyChildren(ctx context.Context, k api.KernelRef, confirmed []int) (childSurvey, error) {
	deadline := time.NewTimer(d.reclaimWatch() + 2*d.cfg.Interval)
	defer deadline.Stop()
	for {
		sampled := d.hist.sampledChan()
		sv, err := d.surveyChildrenNow(ctx, k, confirmed)
		if err != nil || !settlingLeft(sv.plans) {
			return sv, err
		}
		select {
		case <-sampled:
		case <-deadline.C:
			return sv, nil
		case <-ctx.Done():
			return sv, ctx.Err()
		}
	}
}

func (d *Daemon) surveyChildrenNow(ctx context.Context, k api.KernelRef, confirmed []int) (childSurvey, error) {
	obs, err := d.observe(ctx)
	if err != nil {
		return childSurvey{}, err
	}
	d.mu.Lock()
	ks, ok := d.kernels[k.ConnectionFile]
	if !ok || ks.id != k.ID || ks.cur.isZero() {
		d.mu.Unlock()
		return childSurvey{}, fmt.Errorf("kernel %s: its process is not known yet: %w", k.ID, api.ErrKernelNotFound)
	}
	ks.observe(obs.Table) // the tree as it is now, recorded
	sv := childSurvey{obs: obs, self: ks.cur, recorded: maps.Clone(ks.recorded), notebook: ks.notebook}
	pod := ""
	if ks.pod != nil {
		pod = ks.pod.UID
	}
	policy := d.policyLocked(pod, obs.Table, attribution.BytesByPID(obs.Snapshot), ks)
	d.mu.Unlock()
	delete(sv.recorded, sv.self)

	now := time.Now()
	from := now.Add(-d.cfg.Compute.Window)
	sv.plans, sv.notFound = planChildren(policy.decide(sv.recorded, obs.Table),
		func(id procID) judgement { return d.compute.judge(id, from, now) }, d.cfg.Compute, confirmed)
	return sv, nil
}

// childrenBeforeTTL is how long ChildrenBefore's figures wait for the
// FreeChildren that follows the kernel's teardown; older ones describe
// another moment.
const childrenBeforeTTL = 2 * time.Minute

// ChildrenBefore implements api.Backend: the driver's figures of the
// kernel's tree, read now, kept for the FreeChildren from inside the
// kernel that follows its own teardown; and the workers free --children
// would leave running for what they compute (left_running): the kernel
// then runs no teardown, which ends every worker it knows.
func (a apiBackend) ChildrenBefore(ctx context.Context, k api.KernelRef) (json.RawMessage, error) {
	d := a.d
	sv, err := d.surveyChildren(ctx, k, nil)
	if err != nil {
		return nil, err
	}
	nb, _ := notebookOf(sv.obs.Report, k.ConnectionFile)
	d.mu.Lock()
	ks, found := d.kernels[k.ConnectionFile]
	found = found && ks.id == k.ID
	if found {
		ks.childrenBefore, ks.childrenBeforeAt = nb, time.Now()
	}
	d.mu.Unlock()
	if !found {
		return nil, fmt.Errorf("kernel %s: %w", k.ID, api.ErrKernelNotFound)
	}
	left := []int{}
	for _, p := range sv.plans {
		if p.confirm {
			left = append(left, p.ID.PID)
		}
	}
	return json.Marshal(map[string]any{"kernel_id": k.ID, "before": nb.GPUMemoryBytes, "processes": len(nb.Processes), "left_running": left})
}

// takeChildrenBefore hands over, once, the figures ChildrenBefore kept for
// k, when they are recent.
func (d *Daemon) takeChildrenBefore(k api.KernelRef) (attribution.Notebook, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ks, ok := d.kernels[k.ConnectionFile]
	if !ok || ks.id != k.ID || ks.childrenBeforeAt.IsZero() {
		return attribution.Notebook{}, false
	}
	nb, at := ks.childrenBefore, ks.childrenBeforeAt
	ks.childrenBefore, ks.childrenBeforeAt = attribution.Notebook{}, time.Time{}
	return nb, time.Since(at) < childrenBeforeTTL
}

// notebookOf is the report's entry of the kernel of connFile (a kernel id
// may name several kernels; the file names one).
func notebookOf(rep attribution.Report, connFile string) (attribution.Notebook, bool) {
	for _, nb := range rep.Notebooks {
		if nb.ConnectionFile == connFile {
			return nb, true
		}
	}
	return attribution.Notebook{}, false
}

// argvOf is the command line recorded for pid in the kernel's tree.
func argvOf(recorded map[procID]recordedProc, pid int) string {
	for id, rec := range recorded {
		if id.PID == pid {
			return rec.Argv
		}
	}
	return ""
}

func total(per []attribution.GPUBytes) (sum uint64) {
	for _, g := range per {
		sum += g.Bytes
	}
	return sum
}

func subSat(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

func nonNilOutcomes(o []magics.ChildOutcome) []magics.ChildOutcome {
	if o == nil {
		return []magics.ChildOutcome{}
	}
	return o
}
