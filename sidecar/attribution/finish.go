package attribution

import (
	"slices"
	"time"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// Finish is everything the report holds after the join, in one ordered
// list of pure steps applied once per collection (dcgm-exporter's ordered
// transformations): each notebook's display name, pods, stray contexts,
// OOM summaries, activity, each GPU's ranked holders, per-user totals,
// each GPU's level, and the alerts with their text.
// `gpumem ls` and the daemon's samples both call it; every face (CLI,
// magics, server extension, JupyterLab) filters the finished report by
// identity and renders it, and derives no figure or sentence again.
//
// Steps that depend on time or on the daemon's state take it from in:
// the caller gathers it, Finish decides nothing the caller must undo.
// It stamps the report with its schema (ReportSchema): Finish is the one
// writer of a report for output.
func Finish(rep *Report, in FinishInput) {
	rep.Schema = ReportSchema
	for _, s := range finishSteps {
		s.apply(rep, in)
	}
}

// FinishInput is what Finish's steps need beyond the joined report. Its
// zero value finishes a report with no pods, no activity, no evidence and
// alerts off.
type FinishInput struct {
	// Now is when the report is finished: idle times are counted to it.
	Now time.Time
	// Table is the process table the report was attributed from, and Pods
	// tells which pod a process runs in (nil: not on Kubernetes).
	Table *procs.Table
	Pods  Pods
	// Evidence is what each kernel's magics last reported of its
	// frameworks (by connection file; nil for none): FlagStrayContexts.
	Evidence map[string]FrameworkEvidence
	// Previous is the last report finished before this one (nil for a
	// single report): a stray context is flagged once steady since
	// (KeepSteadyStrays).
	Previous *Report
	// OOM is each kernel's out-of-memory summary (by connection file).
	OOM map[string]OOMSummary
	// Kernels is what each kernel's Jupyter server says of it, by
	// connection file; a kernel without an entry has no server that
	// reports its activity.
	Kernels map[string]KernelActivity
	// Culls are the cull warnings that stand (the daemon's culling
	// decided them this sample).
	Culls []CullWarning
	// Alerts configures the threshold alerts.
	Alerts AlertConfig
	// Compute is what the daemon's readings of GPU work over its window
	// judged (nil: none were taken, as in a single report).
	Compute *ComputeFacts
	// Peaks is each notebook's highest figure over the daemon's history,
	// by connection file (nil: no history).
	Peaks map[string]uint64
}

// ComputeFacts is what the daemon judged of GPU work over its window: each
// kernel's verdict, the processes left running after their kernel and
// each user's memory held while computing nothing. Finish's compute step
// writes it into the report; the daemon keeps the readings it rests on.
type ComputeFacts struct {
	// Kernels is each kernel's verdict, by connection file.
	Kernels     map[string]Compute
	LeftRunning []LeftRunning
	Hoarding    []UserHoarding
}

// KernelActivity is what a kernel's server says of it, and what the
// daemon saw itself.
type KernelActivity struct {
	ExecutionState string
	LastActivity   time.Time
	// ComputedAt is the newest reading in which one of the kernel's
	// processes computed on a GPU (zero: none seen, or unknown).
	ComputedAt time.Time
	// ShellBusy: the daemon sees a cell running on the kernel's shell. The
	// server's execution_state follows every status message, those of
	// control requests (answered while a cell runs) too: this view wins.
	ShellBusy bool
}

// Used is when the kernel was last used: its server's last activity, or
// its processes' last work on a GPU, whichever is later.
func (k KernelActivity) Used() time.Time {
	if k.ComputedAt.After(k.LastActivity) {
		return k.ComputedAt
	}
	return k.LastActivity
}

// finishStep is one named step of Finish.
type finishStep struct {
	name  string
	apply func(*Report, FinishInput)
}

// finishSteps are Finish's steps, in order: holders, users and alerts read
// what the steps before them set (the holders and the alerts name
// notebooks by their display names).
var finishSteps = []finishStep{
	{"display_names", addDisplayNames},
	{"pods", func(r *Report, in FinishInput) { AddPods(r, in.Table, in.Pods) }},
	{"compute", addCompute},
	{"peaks", addPeaks},
	{"stray_contexts", func(r *Report, in FinishInput) {
		FlagStrayContexts(r, in.Evidence)
		KeepSteadyStrays(r, in.Previous)
	}},
	{"oom", addOOM},
	{"activity", addActivity},
	{"holders", addHolders},
	{"users", addUsers},
	{"levels", addLevels},
	{"alerts", addAlerts},
}

// FinishSteps names Finish's steps, in order.
func FinishSteps() []string {
	names := make([]string, len(finishSteps))
	for i, s := range finishSteps {
		names[i] = s.name
	}
	return names
}

// addCompute sets each notebook's compute verdict, the processes left
// running and the users' hoarding from the daemon's judgement.
func addCompute(r *Report, in FinishInput) {
	r.LeftRunning, r.Hoarding = nil, nil
	for i := range r.Notebooks {
		r.Notebooks[i].Compute = nil
	}
	if in.Compute == nil {
		return
	}
	for i := range r.Notebooks {
		if c, ok := in.Compute.Kernels[r.Notebooks[i].ConnectionFile]; ok {
			r.Notebooks[i].Compute = &c
		}
	}
	r.LeftRunning = slices.Clone(in.Compute.LeftRunning)
	r.Hoarding = slices.Clone(in.Compute.Hoarding)
}

// addPeaks sets each notebook's peak over the daemon's history.
func addPeaks(r *Report, in FinishInput) {
	for i := range r.Notebooks {
		r.Notebooks[i].PeakBytes = in.Peaks[r.Notebooks[i].ConnectionFile]
	}
}

// addOOM sets each notebook's out-of-memory summary.
func addOOM(r *Report, in FinishInput) {
	for i := range r.Notebooks {
		r.Notebooks[i].OOM = nil
		if s, ok := in.OOM[r.Notebooks[i].ConnectionFile]; ok {
			r.Notebooks[i].OOM = &s
		}
	}
}

// addActivity sets each notebook's Activity from its server's view: idle
// time counted from its last use, a cell the daemon sees running making it
// busy, and the cull planned for it.
func addActivity(r *Report, in FinishInput) {
	culls := map[string]CullWarning{}
	for _, c := range in.Culls {
		culls[c.ConnectionFile] = c
	}
	for i := range r.Notebooks {
		nb := &r.Notebooks[i]
		nb.Activity = nil
		k, ok := in.Kernels[nb.ConnectionFile]
		if !ok || k.LastActivity.IsZero() {
			continue
		}
		a := &Activity{ExecutionState: k.ExecutionState, LastActivity: k.LastActivity}
		switch {
		case k.ShellBusy:
			a.ExecutionState = "busy"
		case k.ExecutionState == "idle":
			a.IdleSeconds = in.Now.Sub(k.Used()).Seconds()
		}
		if c, ok := culls[nb.ConnectionFile]; ok {
			a.CullAt, a.CullAction = c.Deadline, c.Action
		}
		nb.Activity = a
	}
}
