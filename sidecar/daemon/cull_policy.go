package daemon

import (
	"slices"
	"time"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// Culling's policy, pure: what to do with one kernel now (decide, under
// the idle and the GPU-idle rules), what a cull does (nextAction) and the
// GPU-idle spell it goes by (gpuIdleSince). cull.go runs it over the
// kernels and carries out what it decides.

// cullVerdict is what to do with a kernel now.
type cullVerdict int

const (
	cullNothing cullVerdict = iota
	cullWarnNow
	cullCancel
	cullAct
	cullUnknown // its server cannot be asked: never culled, say so
)

// cullInput is what the decision needs of one kernel.
type cullInput struct {
	now          time.Time
	hasServer    bool
	execState    string
	lastActivity time.Time
	bytes        uint64
	user         string
	state        cullState
	// computedAt is the newest reading in which one of the kernel's
	// processes computed on a GPU (zero: none seen, or unknown): such a
	// kernel is in use whatever its server says.
	computedAt time.Time
	// settling: its processes' GPU work is not judged yet for want of
	// readings (the daemon just started, or a process just appeared).
	settling bool
	// gpuIdleSince is since when the kernel's processes did no GPU work,
	// as far as the daemon's verdicts show (its last work, its first idle
	// verdict since, or its user's keep, whichever is later); zero while
	// they compute, or their work is unknown or not judged yet.
	gpuIdleSince time.Time
}

// used is when the kernel was last used: its server's last activity, or
// its processes' last work on a GPU, whichever is later.
func (in cullInput) used() time.Time {
	return attribution.KernelActivity{LastActivity: in.lastActivity, ComputedAt: in.computedAt}.Used()
}

// decide is the culling policy, pure: the GPU-idle rule where it is on
// and judges the kernel, else the idle rule. gpuRule says which rule
// decided (a warning stands under the rule that gave it).
func (c CullConfig) decide(in cullInput) (v cullVerdict, why string, gpuRule bool) {
	warned := !in.state.warnedAt.IsZero()
	gpuFirst := c.GPUIdle > 0 && (!warned || in.state.gpuRule)
	// What both rules need: a server to ask, a user that may be culled.
	switch {
	case !in.hasServer || in.lastActivity.IsZero():
		return cullUnknown, "no Jupyter server reports this kernel's activity", gpuFirst
	case len(c.Users) > 0 && !slices.Contains(c.Users, in.user),
		slices.Contains(c.ExemptUsers, in.user):
		v, why = withdraw(warned, "user "+in.user+" is not culled")
		return v, why, gpuFirst
	}
	if gpuFirst {
		v, why = c.decideGPUIdle(in)
		if warned || v != cullNothing || c.Idle == 0 {
			return v, why, true
		}
	}
	if c.Idle == 0 {
		return cullNothing, why, false
	}
	v, why = c.decideIdle(in)
	return v, why, false
}

// decideGPUIdle is the GPU-idle rule: a kernel that holds at least
// MinMemory and whose processes did no GPU work for GPUIdle is warned, and
// culled once the warning ran out, whatever its cells do; only GPU work or
// its user's keep cancels. It is never acted on while a cell runs, nor on
// missing facts (an unknown or unjudged verdict; decide refuses a kernel
// without a server).
func (c CullConfig) decideGPUIdle(in cullInput) (cullVerdict, string) {
	warned := !in.state.warnedAt.IsZero()
	cancel := func(why string) (cullVerdict, string) { return withdraw(warned, why) }
	switch {
	case in.gpuIdleSince.IsZero():
		return cancel("its processes compute on a GPU, or their GPU work is unknown or not judged yet")
	case warned && in.gpuIdleSince.After(in.state.activityAtWarn) && in.gpuIdleSince.Equal(in.state.keptAt):
		return cullCancel, "kept by its user"
	case warned && in.gpuIdleSince.After(in.state.activityAtWarn):
		return cullCancel, "its processes computed on a GPU since the warning"
	case !in.state.doneAt.IsZero() && !in.gpuIdleSince.After(in.state.doneAt):
		return cullNothing, "already culled; no GPU work since"
	case in.now.Sub(in.gpuIdleSince) < c.GPUIdle:
		return cancel("its processes computed on a GPU within --cull-gpu-idle")
	case in.bytes < c.MinMemory:
		return cancel("holds less than --cull-min-memory")
	case !warned:
		return cullWarnNow, "holding GPU memory with no GPU work"
	case in.now.Before(in.state.deadline):
		return cullNothing, "within its warning period"
	case in.execState != "idle":
		return cullNothing, "the kernel is " + in.execState + ": culled once its cell ends, unless it computes on a GPU"
	}
	return cullAct, "no GPU work through its warning period"
}

// withdraw is a verdict against culling: the warning that stands is
// cancelled, else nothing is done.
func withdraw(warned bool, why string) (cullVerdict, string) {
	if warned {
		return cullCancel, why
	}
	return cullNothing, why
}

// decideIdle is the idle rule: a kernel unused (no cell, no GPU work, no
// keep) for Idle that holds at least MinMemory is warned, and culled once
// the warning ran out unused.
func (c CullConfig) decideIdle(in cullInput) (cullVerdict, string) {
	warned := !in.state.warnedAt.IsZero()
	cancel := func(why string) (cullVerdict, string) { return withdraw(warned, why) }
	switch {
	case in.execState != "idle":
		return cancel("the kernel is " + in.execState)
	case warned && in.computedAt.After(in.state.activityAtWarn):
		return cullCancel, "its processes computed on a GPU since the warning"
	case warned && in.state.keptAt.After(in.state.activityAtWarn):
		return cullCancel, "kept by its user"
	case warned && in.lastActivity.After(in.state.activityAtWarn):
		return cullCancel, "used since the warning"
	case !in.state.doneAt.IsZero() && !in.used().After(in.state.doneAt):
		return cullNothing, "already culled; not used since"
	case in.now.Sub(in.computedAt) < c.Idle:
		return cancel("its processes computed on a GPU within --cull-idle")
	case in.settling && !warned:
		return cullNothing, "its processes' GPU work is not judged yet"
	case in.now.Sub(in.used()) < c.Idle:
		return cancel("idle for less than --cull-idle")
	case in.bytes < c.MinMemory:
		return cancel("holds less than --cull-min-memory")
	case !warned:
		return cullWarnNow, "idle and holding GPU memory"
	case in.now.Before(in.state.deadline):
		return cullNothing, "within its warning period"
	}
	return cullAct, "idle through its warning period"
}

// cullAction is what one cull does (CullReport, CullFree or CullShutdown),
// under which rule, and the use it goes by: under the idle rule the
// kernel's last use, under the GPU-idle rule its last GPU work (or keep).
// Newer use found when it starts cancels it.
type cullAction struct {
	action  string
	gpuRule bool
	since   time.Time
}

// nextAction is what culling the kernel does now under action: the
// GPU-idle rule frees the caches of a kernel it is to shut down first, once
// per spell without GPU work (since), and warns again.
func (s cullState) nextAction(action string, since time.Time) string {
	if s.gpuRule && action == CullShutdown && !s.freedFor.Equal(since) {
		return CullFree
	}
	return action
}

// gpuIdleSince keeps the kernel's GPU-idle spell from this sample's
// verdict and says since when it did no GPU work (zero: it computes, or
// its work is unknown or not judged yet); a keep counts as work.
func (s *cullState) gpuIdleSince(now time.Time, verdict string, computedAt time.Time) time.Time {
	if verdict != attribution.ComputeIdle {
		s.judgedIdleFrom = time.Time{}
		return time.Time{}
	}
	if s.judgedIdleFrom.IsZero() {
		s.judgedIdleFrom = now
	}
	since := s.judgedIdleFrom
	for _, t := range []time.Time{computedAt, s.keptAt} {
		if t.After(since) {
			since = t
		}
	}
	return since
}

// verdictOf is the compute verdict of the kernel of connFile in facts
// ("" when none was judged).
func verdictOf(facts *attribution.ComputeFacts, connFile string) string {
	if facts == nil {
		return ""
	}
	return facts.Kernels[connFile].State
}
