package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/lifeline"
	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/nvml/driver"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/daemon"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/metrics"
	"github.com/gpumem/gpumem/sidecar/procs"
)

func runServe(ctx context.Context, env Env, args []string) error {
	fs := newFlagSet(env, "serve", "[flags]")
	var dirs dirList
	fs.Var(&dirs, "runtime-dir", "also watch this Jupyter runtime `dir` (repeatable; it must exist)")
	interval := fs.Duration("interval", time.Second, "how often to sample GPU memory")
	rescan := fs.Duration("rescan", 5*time.Second, "how often to rescan the runtime dirs besides inotify events (a deleted dir, a missed event)")
	reclaim := fs.Bool("reclaim", true, "end orphans of a restarted or shut-down kernel that still hold GPU memory (false: only report them)")
	grace := fs.Duration("reclaim-grace", 5*time.Second, "how long a dead kernel's survivors are watched for GPU work before any is ended, and the time between SIGTERM and SIGKILL when reclaiming")
	computeWindow := fs.Duration("compute-window", time.Minute, "how far back \"computing on a GPU\" looks: a process computes when at least 2 of its readings in this window reach --compute-threshold (reclaim looks from this long before the kernel's exit)")
	computeThreshold := fs.Uint("compute-threshold", 1, "SM or memory busy percentage that makes a reading count as work on a GPU (1 to 100)")
	reclaimUnknown := fs.String("reclaim-unknown", daemon.ReclaimKeep, "what reclaim does with a survivor whose GPU utilization is unknown (MIG, a driver without per-process utilization): keep (leave it running) or end")
	allUsers := fs.Bool("reclaim-all-users", false, "as root, also reclaim other users' orphans")
	everyUser := fs.Bool("all-users", false, "as root, find and watch every user's kernels (their runtime dirs, kernel processes, Jupyter servers); rescans every 2s unless --rescan says otherwise")
	podKernels := fs.Bool("pod-kernels", false, "as root on a Kubernetes node with the host's pids (hostPID): also find, attach to, inject into and reclaim for the kernels inside this node's pods; reads every pod's connection keys: see deploy/helm/gpumem/README.md; rescans every 2s unless --rescan says otherwise")
	var onlyUsers stringList
	fs.Var(&onlyUsers, "users", "with --all-users, only the kernels of this `user` (repeatable)")
	socket := fs.String("socket", "", "the local API's unix socket (default gpumem.sock in the runtime dir)")
	socketMode := fs.String("socket-mode", "private", "private (0600, this user only) or shared (0666, callers identified by SO_PEERCRED)")
	listen := fs.String("listen", "", "serve Prometheus /metrics on this address (e.g. 127.0.0.1:9464)")
	allowRemote := fs.Bool("listen-allow-remote", false, "allow --listen on an address that is not loopback")
	notebookLabel := fs.Bool("metrics-notebook-label", true, "export per-notebook series (kernel_id, notebook labels); false keeps only per-user series, for large fleets")
	metricsToken := fs.String("metrics-token-file", "", "serve per-notebook series only to scrapes with \"Authorization: Bearer <the token in this file>\" (a file of the daemon's user, mode 600); in shared mode (--socket-mode shared or --all-users) they are served only so")
	threshold := fs.Float64("alert-threshold", 0.8, "warn when a GPU's used memory passes this fraction of its total (0 disables)")
	noNotebookAlerts := fs.Bool("no-notebook-alerts", false, "don't print alerts in notebooks")
	noInject := fs.Bool("no-inject", false, "don't inject the %gpumem magics into kernels")
	cullIdle := fs.Duration("cull-idle", 0, "cull kernels idle this long (by their server's last_activity and their processes' work on a GPU) that hold GPU memory (0: off)")
	cullMin := fs.String("cull-min-memory", "1GiB", "cull only kernels holding at least this much GPU memory (children included)")
	cullAction := fs.String("cull-action", daemon.CullReport, "what culling does: report (log and count), free (cache-only free) or shutdown (through the kernel's server)")
	cullWarn := fs.Duration("cull-warn", 10*time.Minute, "warn in the notebook this long before culling; any use cancels")
	cullUsers := fs.String("cull-users", "", "in shared mode, cull only these users' kernels (comma-separated; default all)")
	cullExempt := fs.String("cull-exempt-users", "", "never cull these users' kernels (comma-separated)")
	var tokenURLs stringList
	fs.Var(&tokenURLs, "server-token-url", "send GPUMEM_SERVER_TOKEN to the servers under this URL (a port may be *: http://127.0.0.1:*/user/; repeatable; also GPUMEM_SERVER_TOKEN_URLS), and to no other")
	logFormat := fs.String("log-format", "auto", "auto (readable on a terminal, JSON otherwise), json or console")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	exitWith := fs.Int("exit-with-parent", 0, "the pid of this daemon's parent (the Jupyter server whose extension started it): when it exits, wait for its kernels to end, reclaim what they left, then stop")
	kf := addKubeFlags(fs, env)
	setFlagGroups(env, fs, "[flags]", serveFlagGroups)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"interval", *interval}, {"rescan", *rescan}} {
		if err := positive(d.name, d.v); err != nil {
			return err
		}
	}
	if *grace < 0 {
		return fmt.Errorf("%w: --reclaim-grace=%v: want a duration of 0 or more", errUsage, *grace)
	}
	if *cullIdle < 0 {
		return fmt.Errorf("%w: --cull-idle=%v: want a duration above 0, or 0 to leave culling off", errUsage, *cullIdle)
	}
	if *cullIdle == 0 {
		// Culling is off: a culling flag alone is a mistake, not a setting.
		for _, n := range []string{"cull-min-memory", "cull-action", "cull-warn", "cull-users", "cull-exempt-users"} {
			if flagGiven(fs, n) {
				return fmt.Errorf("%w: --%s applies to culling, which is off: give --cull-idle=DURATION too (e.g. --cull-idle=3h)", errUsage, n)
			}
		}
	}
	if len(onlyUsers) > 0 && !*everyUser {
		return fmt.Errorf("%w: --users limits --all-users: give --all-users too", errUsage)
	}
	if *podKernels && os.Geteuid() != 0 {
		return fmt.Errorf("%w: --pod-kernels needs root (with CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_KILL): it reads pods' files through their processes' roots and dials their kernels inside their network namespaces", errUsage)
	}
	if (*everyUser || *podKernels) && !flagGiven(fs, "rescan") {
		*rescan = 2 * time.Second // a user who logs in is served within 5 s
	}
	mode, err := api.ParseMode(*socketMode)
	if err != nil {
		return fmt.Errorf("%w: --socket-mode: %v", errUsage, err)
	}
	if *threshold < 0 || *threshold > 1 {
		return fmt.Errorf("%w: --alert-threshold=%v: want a fraction between 0 and 1", errUsage, *threshold)
	}
	minBytes, err := units.ParseBytes(*cullMin)
	if err != nil {
		return fmt.Errorf("%w: --cull-min-memory: %v", errUsage, err)
	}
	cull := daemon.CullConfig{Idle: *cullIdle, MinMemory: minBytes, Action: *cullAction, Warn: *cullWarn,
		Users: splitList(*cullUsers), ExemptUsers: splitList(*cullExempt)}
	if err := cull.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	var scrapeToken string
	if *metricsToken != "" {
		if scrapeToken, err = metrics.ReadTokenFile(*metricsToken); err != nil {
			return fmt.Errorf("%w: --metrics-token-file: %v", errUsage, err)
		}
	}
	token, urls, err := serverToken(env, tokenURLs)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if token != "" && len(urls) == 0 {
		return fmt.Errorf("%w: GPUMEM_SERVER_TOKEN is set, but no --server-token-url (or GPUMEM_SERVER_TOKEN_URLS) says which servers it is for: "+
			"a server file is its user's to write, so the token is sent only to the servers named", errUsage)
	}
	if *computeThreshold < 1 || *computeThreshold > 100 || *computeWindow <= 0 {
		return fmt.Errorf("%w: --compute-threshold=%d --compute-window=%v: want a percentage from 1 to 100 and a positive window", errUsage, *computeThreshold, *computeWindow)
	}
	compute := daemon.ComputeConfig{Window: *computeWindow, ThresholdPercent: uint32(*computeThreshold), ReclaimUnknown: *reclaimUnknown}
	if err := compute.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	log, err := newLogger(env.Stderr, *logFormat, *logLevel)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	ctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	profileWindow(ctx, env, log)
	var parent *lifeline.Watch
	if *exitWith != 0 {
		// Before anything else: a parent already gone starts nothing.
		if parent, err = lifeline.Start(ctx, lifeline.Options{Parent: *exitWith, Children: env.procFS().ChildrenOf}); err != nil {
			return fmt.Errorf("--exit-with-parent=%d: %w", *exitWith, err)
		}
		// The watch ends with ctx: end it first, whatever returns early.
		defer func() { stopRun(); parent.Close() }()
	}
	pods, stopPods, err := kf.start(ctx, env.procFS(), log)
	if err != nil {
		return err
	}
	defer stopPods()
	runtimeDirs := discovery.RuntimeDirs(env.getenv, []string(dirs))
	sock := *socket
	if sock == "" {
		sock = filepath.Join(runtimeDirs[0], api.DefaultSocketName)
		if err := os.MkdirAll(runtimeDirs[0], 0o700); err != nil {
			return fmt.Errorf("runtime dir %s: %w", runtimeDirs[0], err)
		}
	}
	// The real dependencies, built once here.
	// A process's utilization reading stands twice the interval, so that
	// none falls between two samples (the daemon counts each reading once).
	gpus, err := driver.Open(driver.Options{FakeGPUFile: env.getenv("GPUMEM_FAKE_GPU"),
		UtilizationWindow: max(driver.DefaultUtilizationWindow, 2**interval)})
	if err != nil {
		return err
	}
	defer gpus.Close()
	if err := gpus.InitErr(); err != nil {
		// Once, at start: every later sample has no GPU to report.
		log.Warn().Err(err).Msg(nvml.NoDriverWarning)
	}
	proc := env.procFS()
	userDirs := allUserDirs(*everyUser, onlyUsers, proc)
	// Samples read the kernels' trees and what changed; the rest reads proc.
	trees := procs.NewTracker(proc)
	defer trees.Close()
	deps := daemon.Deps{GPUs: gpus, Procs: trees, Finder: discovery.NewProcFinder(proc), UserDirs: userDirs, Pods: pods}
	if *podKernels {
		deps.PodKernels, deps.Cgroups = discovery.NewPodFinder(proc), proc
	}
	d, err := daemon.New(daemon.Config{
		RuntimeDirs:        runtimeDirs,
		Interval:           *interval,
		Rescan:             *rescan,
		Reclaim:            *reclaim,
		ReclaimGrace:       *grace,
		ReclaimAllUsers:    *allUsers,
		AllUsers:           *everyUser,
		SocketPath:         sock,
		SocketMode:         mode,
		MetricsAddr:        *listen,
		MetricsAllowRemote: *allowRemote,
		MetricsNoNotebook:  !*notebookLabel,
		MetricsToken:       scrapeToken,
		AlertThreshold:     *threshold,
		NotebookAlerts:     !*noNotebookAlerts,
		InjectMagics:       !*noInject,
		ServerToken:        token,
		ServerTokenURLs:    urls,
		Cull:               cull,
		Compute:            compute,
	}, deps, log)
	if err != nil {
		return err
	}
	if parent == nil {
		return servedBy(env, d.Run(ctx), sock, runtimeDirs)
	}
	var leaving sync.WaitGroup
	leaving.Add(1)
	go func() {
		defer leaving.Done()
		leaveWithParent(ctx, parent, *exitWith, d, log)
		stopRun()
	}()
	err = servedBy(env, d.Run(ctx), sock, runtimeDirs)
	stopRun()
	leaving.Wait()
	return err
}

// childrenWait bounds the wait for the kernels of a server that is gone:
// ipykernel notices its parent's death within a second or two.
const childrenWait = 10 * time.Second

// leaveWithParent returns when ctx ends or, once the parent is gone, after
// its kernels have ended and the orphans they left are reclaimed: no gpumem
// process outlives its Jupyter server by more than that.
func leaveWithParent(ctx context.Context, parent *lifeline.Watch, pid int, d *daemon.Daemon, log zerolog.Logger) {
	select {
	case <-ctx.Done():
		return
	case <-parent.Gone():
	}
	log.Info().Int("pid", pid).Ints("waiting_for", parent.Following()).
		Msg("the process that started this daemon exited: waiting for its kernels to end and reclaiming what they left, then stopping")
	wctx, cancel := context.WithTimeout(ctx, childrenWait)
	left := parent.WaitChildren(wctx)
	cancel()
	if len(left) > 0 {
		log.Warn().Ints("pids", left).Dur("waited", childrenWait).Msg("children of the exited parent still run: not waiting longer")
	}
	// The orphans' reclaim watches them for the grace window first.
	sctx, cancel := context.WithTimeout(ctx, d.ReclaimTakes()+childrenWait)
	defer cancel()
	if err := d.Settle(sctx); err != nil {
		log.Warn().Err(err).Msg("stopping before every reclaim finished")
	}
}

// serveFlagGroups are the headings of gpumem serve -h.
var serveFlagGroups = []flagGroup{
	{"Sampling", []string{"interval", "runtime-dir", "rescan", "no-inject"}},
	{"Reclaim (orphans of restarted or shut-down kernels)", []string{"reclaim", "reclaim-grace", "reclaim-unknown", "reclaim-all-users"}},
	{"GPU work (what counts as computing, for reclaim and culling)", []string{"compute-window", "compute-threshold"}},
	{"Culling (idle kernels that hold GPU memory; off unless --cull-idle)", []string{"cull-idle", "cull-min-memory", "cull-action", "cull-warn", "cull-users", "cull-exempt-users"}},
	{"Alerts", []string{"alert-threshold", "no-notebook-alerts"}},
	{"Local API and metrics", []string{"socket", "listen", "listen-allow-remote", "metrics-notebook-label", "metrics-token-file"}},
	{"Shared host (root, many users)", []string{"all-users", "users", "socket-mode", "server-token-url"}},
	{"Kubernetes", []string{"kubernetes", "pod-kernels", "node-name", "user-labels", "server-labels", "kubernetes-sync-timeout"}},
	{"Lifetime (a daemon a Jupyter server started)", []string{"exit-with-parent"}},
	{"Logging", []string{"log-format", "log-level"}},
}

func newLogger(w io.Writer, format, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("--log-level=%q: want debug, info, warn or error", level)
	}
	switch format {
	case "auto":
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, FormatPrepare: safeLogFields}
		}
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: true, FormatPrepare: safeLogFields}
	case "json":
	default:
		return zerolog.Logger{}, fmt.Errorf("--log-format=%q: want auto, json or console", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// safeLogFields makes every string of a console log line safe for a
// terminal: notebooks, kernel ids, argv and errors naming others' files
// reach the log (the JSON format escapes them by itself). The message too:
// the console writer prints it raw.
func safeLogFields(evt map[string]any) error {
	for k, v := range evt {
		if s, ok := v.(string); ok {
			evt[k] = textsafe.Line(s)
		}
	}
	return nil
}

// splitList splits a comma-separated flag, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
