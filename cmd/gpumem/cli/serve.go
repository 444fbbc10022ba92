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
	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/nvml/driver"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/daemon"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// runServe is gpumem serve: its flags parsed and checked before anything
// starts, then the daemon built on the real dependencies and run.
func runServe(ctx context.Context, env Env, args []string) error {
	f, err := parseServeFlags(env, args)
	if err != nil {
		return err
	}
	if err := f.check(); err != nil {
		return err
	}
	s, err := f.settings(env)
	if err != nil {
		return err
	}
	return serve(ctx, env, f, s)
}

// serve builds the daemon's real dependencies, once, here, and runs it
// until ctx ends or, with --exit-with-parent, its parent is gone and what
// that left is reclaimed. Every dependency is closed in the reverse order
// of its making, after the daemon and the parent's watch have stopped.
func serve(ctx context.Context, env Env, f *serveFlags, s serveSettings) error {
	log := s.log
	ctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	profileWindow(ctx, env, log)
	var parent *lifeline.Watch
	if f.exitWith != 0 {
		// Before anything else: a parent already gone starts nothing.
		var err error
		if parent, err = lifeline.Start(ctx, lifeline.Options{Parent: f.exitWith, Children: env.procFS().ChildrenOf}); err != nil {
			return fmt.Errorf("--exit-with-parent=%d: %w", f.exitWith, err)
		}
		// The watch ends with ctx: end it first, whatever returns early.
		defer func() { stopRun(); parent.Close() }()
	}
	pods, stopPods, err := f.kube.start(ctx, env.procFS(), log)
	if err != nil {
		return err
	}
	defer stopPods()
	runtimeDirs := discovery.RuntimeDirs(env.getenv, []string(f.dirs))
	sock, err := socketPath(f.socket, runtimeDirs)
	if err != nil {
		return err
	}
	// A process's utilization reading stands twice the interval, so that
	// none falls between two samples (the daemon counts each reading once).
	gpus, err := driver.Open(driver.Options{FakeGPUFile: env.getenv("GPUMEM_FAKE_GPU"), Library: env.NVML,
		UtilizationWindow: max(driver.DefaultUtilizationWindow, 2*f.interval)})
	if err != nil {
		return err
	}
	defer gpus.Close()
	if err := gpus.InitErr(); err != nil {
		// Once, at start: every later sample has no GPU to report.
		log.Warn().Err(err).Msg(nvml.NoDriverWarning)
	}
	proc := env.procFS()
	userDirs := allUserDirs(f.everyUser, f.onlyUsers, proc)
	// Samples read the kernels' trees and what changed; the rest reads proc.
	trees := procs.NewTracker(proc)
	defer trees.Close()
	deps := daemon.Deps{GPUs: gpus, Procs: trees, Finder: discovery.NewProcFinder(proc), UserDirs: userDirs, Pods: pods}
	if f.podKernels {
		deps.PodKernels, deps.Cgroups = discovery.NewPodFinder(proc), proc
	}
	d, err := daemon.New(f.daemonConfig(s, runtimeDirs, sock), deps, log)
	if err != nil {
		return err
	}
	if parent == nil {
		return servedBy(env, d.Run(ctx), sock, runtimeDirs)
	}
	return runLeavingWithParent(ctx, stopRun, env, d, parent, f.exitWith, sock, runtimeDirs, log)
}

// socketPath is the local API's socket: --socket, else gpumem.sock in the
// first runtime dir, which is made (0700) if missing so the daemon can
// listen there.
func socketPath(socket string, runtimeDirs []string) (string, error) {
	if socket != "" {
		return socket, nil
	}
	if err := os.MkdirAll(runtimeDirs[0], 0o700); err != nil {
		return "", fmt.Errorf("runtime dir %s: %w", runtimeDirs[0], err)
	}
	return filepath.Join(runtimeDirs[0], api.DefaultSocketName), nil
}

// daemonConfig is the daemon's Config from serve's flags, their settings
// and the paths made at start.
func (f *serveFlags) daemonConfig(s serveSettings, runtimeDirs []string, sock string) daemon.Config {
	return daemon.Config{
		RuntimeDirs:        runtimeDirs,
		Interval:           f.interval,
		Rescan:             f.rescan,
		Reclaim:            f.reclaim,
		ReclaimGrace:       f.grace,
		ReclaimAllUsers:    f.allUsers,
		AllUsers:           f.everyUser,
		SocketPath:         sock,
		SocketMode:         s.mode,
		MetricsAddr:        f.listen,
		MetricsAllowRemote: f.allowRemote,
		MetricsNoNotebook:  !f.notebookLabel,
		MetricsToken:       s.scrapeToken,
		AlertThreshold:     f.threshold,
		NotebookAlerts:     !f.noNotebookAlerts,
		InjectMagics:       !f.noInject,
		ServerToken:        s.serverToken,
		ServerTokenURLs:    s.serverTokenURLs,
		Cull:               s.cull,
		Compute:            s.compute,
	}
}

// runLeavingWithParent runs d until ctx ends or, once the parent (pid) is
// gone, leaveWithParent is done: then stopRun ends the run. It returns
// after both, so no goroutine outlives the command.
func runLeavingWithParent(ctx context.Context, stopRun context.CancelFunc, env Env, d *daemon.Daemon, parent *lifeline.Watch, pid int, sock string, runtimeDirs []string, log zerolog.Logger) error {
	var leaving sync.WaitGroup
	leaving.Add(1)
	go func() {
		defer leaving.Done()
		leaveWithParent(ctx, parent, pid, d, log)
		stopRun()
	}()
	err := servedBy(env, d.Run(ctx), sock, runtimeDirs)
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
