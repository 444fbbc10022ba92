package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
)

// GPU-aware culling: Jupyter's own cullers judge by activity alone; this one
// acts only on an idle kernel that holds GPU memory, warns first, and never
// touches a busy kernel, one whose server cannot be asked, or one used
// since the warning.

// Cull actions: attribution's, whose warnings name them.
const (
	CullReport   = attribution.CullReport
	CullFree     = attribution.CullFree
	CullShutdown = attribution.CullShutdown
)

// CullConfig is `gpumem serve --cull-*`.
type CullConfig struct {
	Idle time.Duration // idle this long (server's last_activity); 0: this rule is off
	// GPUIdle: no GPU work by the kernel's processes for this long, however
	// its cells run (a keep-alive cell does not count as use); 0: off.
	// Under it a shutdown is preceded by a free of the caches, the
	// reversible action, and another warning.
	GPUIdle   time.Duration
	MinMemory uint64        // only kernels holding at least this (driver's figure, children included)
	Action    string        // CullReport, CullFree or CullShutdown
	Warn      time.Duration // warning period before acting
	// Users, when set, are the only users whose kernels may be culled;
	// ExemptUsers are never culled.
	Users, ExemptUsers []string
}

// Enabled reports whether culling is on (by either rule).
func (c CullConfig) Enabled() bool { return c.Idle > 0 || c.GPUIdle > 0 }

// Validate checks the flags.
func (c CullConfig) Validate() error {
	if !c.Enabled() {
		return nil
	}
	switch c.Action {
	case CullReport, CullFree, CullShutdown:
	default:
		return fmt.Errorf("--cull-action=%q: want report, free or shutdown", c.Action)
	}
	if c.Warn < 0 {
		return fmt.Errorf("--cull-warn=%v: want a duration of 0 or more", c.Warn)
	}
	if c.GPUIdle < 0 || c.Idle < 0 {
		return fmt.Errorf("--cull-idle=%v, --cull-gpu-idle=%v: want durations of 0 (off) or more", c.Idle, c.GPUIdle)
	}
	if c.GPUIdle > 0 && c.MinMemory == 0 {
		return errors.New("--cull-gpu-idle needs --cull-min-memory above 0: the rule culls kernels that hold GPU memory and compute nothing")
	}
	return nil
}

// cullState is a kernel's culling progress, guarded by Daemon.mu.
type cullState struct {
	warnedAt       time.Time // zero: no warning stands
	deadline       time.Time
	activityAtWarn time.Time // the server's last_activity when warned
	warnings       int       // warnings so far: each alert id is new
	// doneAt is the server's last_activity when the action was taken: the
	// kernel is not culled again until it has been used.
	doneAt time.Time
	// keptAt is when its user last kept it from the cull (KeepKernel, the
	// notification's "Keep it"): a keep counts as use.
	keptAt time.Time
	// gpuRule: the warning that stands (or the action under way) is the
	// GPU-idle rule's.
	gpuRule bool
	// judgedIdleFrom is the first sample since its last GPU work whose
	// verdict found the kernel idle (zero: computing, unknown or not
	// judged yet); freedFor is the GPU-idle spell (its gpuIdleSince) in
	// which the GPU-idle rule freed its caches.
	judgedIdleFrom time.Time
	freedFor       time.Time
}

// cull runs the policy over the kernels of rep (the sample just taken)
// and starts the actions due. It returns the warnings that stand and what
// each kernel's server says of it (by connection file), for
// attribution.Finish: it changes nothing in rep.
func (d *Daemon) cull(ctx context.Context, rep attribution.Report, compute *attribution.ComputeFacts) ([]attribution.CullWarning, map[string]attribution.KernelActivity) {
	now := time.Now()
	// By connection file: another user's kernel may share an id.
	bytes := make(map[string]uint64, len(rep.Notebooks))
	users := make(map[string]string, len(rep.Notebooks))
	for _, nb := range rep.Notebooks {
		bytes[nb.ConnectionFile], users[nb.ConnectionFile] = nb.GPUMemoryBytes, nb.User
	}
	type job struct {
		ks     *kernelState
		bytes  uint64
		server discovery.Server
		act    cullAction
		before cullState // the kernel's cull state before the act
	}
	var jobs []job
	var warnings []attribution.CullWarning
	d.mu.Lock()
	activity := make(map[string]attribution.KernelActivity, len(d.kernels))
	for _, ks := range d.kernels {
		hasServer := ks.server.URL != "" && !ks.lastActivity.IsZero()
		computedAt := d.compute.kernelComputedAt(ks.connFile)
		// The kernel was used until its main shell's last status that the
		// daemon saw, if that is later than what the server last said (its
		// sessions are read now and then: a cell that ended a moment ago
		// must not count as idle since the server's last reading).
		lastActivity := ks.lastActivity
		if ks.client != nil {
			if w := ks.client.LastShellWork(); w.After(lastActivity) {
				lastActivity = w
			}
		}
		if ks.cull.keptAt.After(lastActivity) {
			lastActivity = ks.cull.keptAt
		}
		act := attribution.KernelActivity{ExecutionState: ks.execState, LastActivity: lastActivity, ComputedAt: computedAt}
		used := act.Used()
		if !d.cfg.Cull.Enabled() {
			if hasServer {
				activity[ks.connFile] = act
			}
			continue
		}
		// The server's execution_state follows every status message, those
		// of control requests (answered while a cell runs) too: the
		// daemon's own view of the shell wins when it sees a cell running.
		state := ks.execState
		if hasServer && ks.shellBusy(now) {
			state, act.ShellBusy = "busy", true
		}
		if hasServer {
			activity[ks.connFile] = act
		}
		in := cullInput{now: now, hasServer: hasServer, execState: state, lastActivity: lastActivity,
			bytes: bytes[ks.connFile], user: users[ks.connFile], state: ks.cull, computedAt: computedAt,
			settling: d.compute.kernelSettling(ks.connFile), gpuIdleSince: ks.cull.gpuIdleSince(now, verdictOf(compute, ks.connFile), computedAt)}
		verdict, why, gpuRule := d.cfg.Cull.decide(in)
		if gpuRule {
			used = in.gpuIdleSince
		}
		// The logger is built only for a verdict that logs: this runs for
		// every kernel at every sample.
		logger := func() zerolog.Logger {
			return d.log.With().Str("kernel_id", ks.id).Str("notebook", ks.notebook).Str("user", users[ks.connFile]).
				Uint64("bytes", bytes[ks.connFile]).Dur("idle", now.Sub(used)).Str("action", ks.cull.nextAction(d.cfg.Cull.Action, used)).
				Bool("gpu_idle_rule", gpuRule).Logger()
		}
		switch verdict {
		case cullUnknown:
			ks.cull.warnedAt = time.Time{}
			if bytes[ks.connFile] >= d.cfg.Cull.MinMemory && !ks.cur.isZero() {
				d.problem(fmt.Errorf("kernel %s (%s) holds %s, but no Jupyter server reports its activity: never culled",
					ks.id, ks.notebook, units.Bytes(bytes[ks.connFile])))
			}
		case cullWarnNow:
			ks.cull.warnedAt, ks.cull.deadline, ks.cull.activityAtWarn = now, now.Add(d.cfg.Cull.Warn), used
			ks.cull.warnings, ks.cull.gpuRule = ks.cull.warnings+1, gpuRule
			log := logger()
			log.Warn().Time("cull_at", ks.cull.deadline).Msg("idle kernel holds GPU memory: warned")
		case cullCancel:
			ks.cull.warnedAt = time.Time{}
			log := logger()
			log.Info().Str("reason", why).Msg("cull cancelled")
		case cullAct:
			act := cullAction{action: ks.cull.nextAction(d.cfg.Cull.Action, used), gpuRule: ks.cull.gpuRule, since: used}
			before := ks.cull
			ks.cull.warnedAt = time.Time{}
			if act.action == d.cfg.Cull.Action {
				ks.cull.doneAt = used
			} else { // the GPU-idle rule's free before its shutdown: warned again after it
				ks.cull.freedFor = used
			}
			jobs = append(jobs, job{ks, bytes[ks.connFile], ks.server, act, before})
		}
		if !ks.cull.warnedAt.IsZero() {
			warnings = append(warnings, attribution.CullWarning{KernelID: ks.id, ConnectionFile: ks.connFile,
				User: users[ks.connFile], Warning: ks.cull.warnings, Deadline: ks.cull.deadline,
				Action: ks.cull.nextAction(d.cfg.Cull.Action, used), Bytes: bytes[ks.connFile], Idle: now.Sub(used),
				GPUIdle: ks.cull.gpuRule})
		}
	}
	d.mu.Unlock()
	for _, j := range jobs {
		d.wg.Add(1)
		go func() { defer d.wg.Done(); d.cullKernel(ctx, j.ks, j.server, j.bytes, j.act, j.before) }()
	}
	return warnings, activity
}

// cullFreeTimeout bounds the cull's free: the kernel was idle a moment ago,
// so a cache-only free answers in well under a second; one that does not
// answer in this long is stopped or hung (or a cell began meanwhile), and
// waiting longer would hold a goroutine and the kernel's cull for as long
// as it stays so. The request stays queued in the kernel, which runs it
// (harmless: caches only) if it ever resumes.
const cullFreeTimeout = 30 * time.Second

// cullKernel asks the server once more (the kernel may have been used
// since the last scan) and, if it is still idle and unused, acts.
func (d *Daemon) cullKernel(ctx context.Context, ks *kernelState, server discovery.Server, bytes uint64, act cullAction, before cullState) {
	d.mu.Lock()
	notebook, client, busy := ks.notebook, ks.client, ks.shellBusy(time.Now())
	d.mu.Unlock()
	log := d.log.With().Str("kernel_id", ks.id).Str("notebook", notebook).Uint64("bytes", bytes).
		Str("action", act.action).Bool("gpu_idle_rule", act.gpuRule).Logger()
	if busy {
		log.Info().Msg("cull cancelled: a cell is running")
		d.cellDelaysCull(ks, act, before)
		return
	}
	if d.compute.kernelComputedAt(ks.connFile).After(act.since) {
		log.Info().Msg("cull cancelled: its processes computed on a GPU")
		return
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	sessions, err := server.Sessions(ctx, hc)
	if err != nil {
		log.Warn().Err(err).Msg("cull: the kernel's server cannot be asked; nothing done")
		return
	}
	fresh := false
	for _, s := range sessions {
		if s.Kernel.ID != ks.id {
			continue
		}
		last, _ := time.Parse(time.RFC3339Nano, s.Kernel.LastActivity)
		if s.Kernel.ExecutionState != "idle" {
			log.Info().Str("state", s.Kernel.ExecutionState).Msg("cull cancelled: a cell is running")
			d.cellDelaysCull(ks, act, before)
			return
		}
		// Under the GPU-idle rule a cell is no use: only GPU work counts.
		if !act.gpuRule && last.After(act.since) {
			log.Info().Msg("cull cancelled: the kernel was used")
			return
		}
		fresh = true
	}
	if !fresh {
		log.Info().Msg("cull: the server no longer lists the kernel; nothing done")
		return
	}
	d.carryOutCull(ctx, log, ks, server, hc, client, act.action)
}

// cellDelaysCull puts back the warning of a GPU-idle cull that a running
// cell stopped: that rule acts once the cell ends (cells do not count as
// use), at a later sample. An idle rule's cull is over: the cell is use.
func (d *Daemon) cellDelaysCull(ks *kernelState, act cullAction, before cullState) {
	if !act.gpuRule {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if ks.cull.warnedAt.IsZero() {
		ks.cull.warnedAt, ks.cull.deadline, ks.cull.activityAtWarn = before.warnedAt, before.deadline, before.activityAtWarn
		ks.cull.doneAt, ks.cull.freedFor = before.doneAt, before.freedFor
	}
}

// carryOutCull does a cull's action on a kernel its server just showed
// idle and unused.
func (d *Daemon) carryOutCull(ctx context.Context, log zerolog.Logger, ks *kernelState, server discovery.Server, hc *http.Client,
	client *protocol.Client, action string) {
	switch action {
	case CullReport:
		log.Warn().Msg("idle kernel holds GPU memory (culling reports only)")
	case CullFree:
		if client == nil {
			log.Warn().Msg("cull: not attached to the kernel; nothing freed")
			return
		}
		fctx, cancel := context.WithTimeout(ctx, cullFreeTimeout)
		rep, err := magics.FreeCache(fctx, client, magics.FreeOptions{})
		cancel()
		if err != nil {
			log.Warn().Err(err).Dur("deadline", cullFreeTimeout).Msg("cull: free failed")
			return
		}
		log.Warn().Int("frameworks", len(rep.Frameworks)).Msg("idle kernel's GPU caches freed")
	case CullShutdown:
		if err := server.ShutdownKernel(ctx, hc, ks.id); err != nil {
			log.Warn().Err(err).Msg("cull: shutdown failed")
			return
		}
		log.Warn().Msg("idle kernel holding GPU memory shut down through its server")
	}
	d.metrics.AddCulled(action)
}

// summary is the culling setup, for the start-up log.
func (c CullConfig) summary() string {
	if !c.Enabled() {
		return "off"
	}
	var rules []string
	if c.Idle > 0 {
		rules = append(rules, units.Duration(c.Idle)+" idle")
	}
	if c.GPUIdle > 0 {
		rules = append(rules, units.Duration(c.GPUIdle)+" without GPU work")
	}
	s := fmt.Sprintf("%s after %s holding >= %s, warned %s before", c.Action, strings.Join(rules, " or "), units.Bytes(c.MinMemory), units.Duration(c.Warn))
	if len(c.Users) > 0 {
		s += "; users " + strings.Join(c.Users, ",")
	}
	if len(c.ExemptUsers) > 0 {
		s += "; exempt " + strings.Join(c.ExemptUsers, ",")
	}
	return s
}

// KeepKernel implements api.Backend: the kernel's user keeps it from the
// cull ("Keep it" on the warning). The keep counts as use: a warning that
// stands is cancelled at the next sample, and the kernel's idle time starts
// again from now.
func (a apiBackend) KeepKernel(ctx context.Context, k api.KernelRef) (api.KeepReply, error) {
	d := a.d
	if !d.cfg.Cull.Enabled() {
		return api.KeepReply{}, fmt.Errorf("%w: this gpumem serve culls no kernel (it runs without --cull-idle): nothing to keep kernel %s from",
			api.ErrRefused, k.ID)
	}
	now := time.Now()
	d.mu.Lock()
	ks, ok := d.kernels[k.ConnectionFile]
	if !ok || ks.id != k.ID {
		d.mu.Unlock()
		return api.KeepReply{}, fmt.Errorf("kernel %s: %w", k.ID, api.ErrKernelNotFound)
	}
	ks.cull.keptAt = now
	notebook, warned := ks.notebook, !ks.cull.warnedAt.IsZero()
	d.mu.Unlock()
	d.log.Info().Str("kernel_id", k.ID).Str("notebook", notebook).Bool("warned", warned).Msg("kept from the cull by its user")
	d.sampleSoon() // the warning goes from the report at once
	return api.KeepReply{KernelID: k.ID, KeptAt: now, Text: keepText(notebook, k.ID, d.cfg.Cull)}, nil
}

// keepText is what a keep says: which notebook, and when it may be culled
// again.
func keepText(notebook, id string, c CullConfig) string {
	again := units.Duration(c.Idle) + " idle"
	if c.Idle == 0 || (c.GPUIdle > 0 && c.GPUIdle < c.Idle) {
		again = units.Duration(c.GPUIdle) + " without GPU work"
	}
	return fmt.Sprintf("Kept %s: it counts as used now, so it is warned again only after %s.",
		attribution.KernelName(notebook, id), again)
}
