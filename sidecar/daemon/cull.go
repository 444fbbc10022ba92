package daemon

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/magics"
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
	Idle      time.Duration // idle this long (server's last_activity); 0 disables culling
	MinMemory uint64        // only kernels holding at least this (driver's figure, children included)
	Action    string        // CullReport, CullFree or CullShutdown
	Warn      time.Duration // warning period before acting
	// Users, when set, are the only users whose kernels may be culled;
	// ExemptUsers are never culled.
	Users, ExemptUsers []string
}

// Enabled reports whether culling is on.
func (c CullConfig) Enabled() bool { return c.Idle > 0 }

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
}

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
}

// used is when the kernel was last used: its server's last activity, or
// its processes' last work on a GPU, whichever is later.
func (in cullInput) used() time.Time {
	return attribution.KernelActivity{LastActivity: in.lastActivity, ComputedAt: in.computedAt}.Used()
}

// decide is the culling policy, pure.
func (c CullConfig) decide(in cullInput) (cullVerdict, string) {
	warned := !in.state.warnedAt.IsZero()
	cancel := func(why string) (cullVerdict, string) {
		if warned {
			return cullCancel, why
		}
		return cullNothing, why
	}
	switch {
	case !in.hasServer || in.lastActivity.IsZero():
		return cullUnknown, "no Jupyter server reports this kernel's activity"
	case len(c.Users) > 0 && !slices.Contains(c.Users, in.user),
		slices.Contains(c.ExemptUsers, in.user):
		return cancel("user " + in.user + " is not culled")
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

// cull runs the policy over the kernels of rep (the sample just taken)
// and starts the actions due. It returns the warnings that stand and what
// each kernel's server says of it (by connection file), for
// attribution.Finish: it changes nothing in rep.
func (d *Daemon) cull(ctx context.Context, rep attribution.Report) ([]attribution.CullWarning, map[string]attribution.KernelActivity) {
	now := time.Now()
	// By connection file: another user's kernel may share an id.
	bytes := map[string]uint64{}
	users := map[string]string{}
	for _, nb := range rep.Notebooks {
		bytes[nb.ConnectionFile], users[nb.ConnectionFile] = nb.GPUMemoryBytes, nb.User
	}
	type job struct {
		ks     *kernelState
		bytes  uint64
		server discovery.Server
	}
	var jobs []job
	var warnings []attribution.CullWarning
	activity := map[string]attribution.KernelActivity{}
	d.mu.Lock()
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
			settling: d.compute.kernelSettling(ks.connFile)}
		verdict, why := d.cfg.Cull.decide(in)
		// The logger is built only for a verdict that logs: this runs for
		// every kernel at every sample.
		logger := func() zerolog.Logger {
			return d.log.With().Str("kernel_id", ks.id).Str("notebook", ks.notebook).Str("user", users[ks.connFile]).
				Uint64("bytes", bytes[ks.connFile]).Dur("idle", now.Sub(used)).Str("action", d.cfg.Cull.Action).Logger()
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
			ks.cull.warnings++
			log := logger()
			log.Warn().Time("cull_at", ks.cull.deadline).Msg("idle kernel holds GPU memory: warned")
		case cullCancel:
			ks.cull.warnedAt = time.Time{}
			log := logger()
			log.Info().Str("reason", why).Msg("cull cancelled")
		case cullAct:
			ks.cull.warnedAt, ks.cull.doneAt = time.Time{}, used
			jobs = append(jobs, job{ks, bytes[ks.connFile], ks.server})
		}
		if !ks.cull.warnedAt.IsZero() {
			warnings = append(warnings, attribution.CullWarning{KernelID: ks.id, ConnectionFile: ks.connFile,
				User: users[ks.connFile], Warning: ks.cull.warnings, Deadline: ks.cull.deadline, Action: d.cfg.Cull.Action,
				Bytes: bytes[ks.connFile], Idle: now.Sub(used)})
		}
	}
	d.mu.Unlock()
	for _, j := range jobs {
		d.wg.Add(1)
		go func() { defer d.wg.Done(); d.cullKernel(ctx, j.ks, j.server, j.bytes) }()
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
func (d *Daemon) cullKernel(ctx context.Context, ks *kernelState, server discovery.Server, bytes uint64) {
	d.mu.Lock()
	notebook, since, client, busy := ks.notebook, ks.cull.doneAt, ks.client, ks.shellBusy(time.Now())
	d.mu.Unlock()
	log := d.log.With().Str("kernel_id", ks.id).Str("notebook", notebook).Uint64("bytes", bytes).
		Str("action", d.cfg.Cull.Action).Logger()
	if busy {
		log.Info().Msg("cull cancelled: a cell is running")
		return
	}
	if d.compute.kernelComputedAt(ks.connFile).After(since) {
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
		if s.Kernel.ExecutionState != "idle" || last.After(since) {
			log.Info().Str("state", s.Kernel.ExecutionState).Msg("cull cancelled: the kernel was used")
			return
		}
		fresh = true
	}
	if !fresh {
		log.Info().Msg("cull: the server no longer lists the kernel; nothing done")
		return
	}
	switch d.cfg.Cull.Action {
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
	d.metrics.AddCulled(d.cfg.Cull.Action)
}

// summary is the culling setup, for the start-up log.
func (c CullConfig) summary() string {
	if !c.Enabled() {
		return "off"
	}
	s := fmt.Sprintf("%s after %s idle holding >= %s, warned %s before", c.Action, units.Duration(c.Idle), units.Bytes(c.MinMemory), units.Duration(c.Warn))
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
	return fmt.Sprintf("Kept %s: it counts as used now, so it is warned again only after %s idle.",
		attribution.KernelName(notebook, id), units.Duration(c.Idle))
}
