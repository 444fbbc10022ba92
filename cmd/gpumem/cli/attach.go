package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/daemon"
	"github.com/gpumem/gpumem/sidecar/discovery"
)

func runAttach(ctx context.Context, env Env, args []string) error {
	fs := newFlagSet(env, "attach", "KERNEL [--runtime-dir DIR ...]\n\nKERNEL is a kernel id (or a unique prefix), a notebook path, or a connection file.")
	var dirs dirList
	fs.Var(&dirs, "runtime-dir", "also look in this Jupyter runtime `dir` (repeatable; it must exist)")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait, e.g. for a busy kernel's current cell to finish")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := positive("timeout", *timeout); err != nil {
		return err
	}
	if err := wantArgs(fs, pos, "KERNEL"); err != nil {
		return err
	}
	k, err := resolveKernel(ctx, env, pos[0], dirs)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	c, err := dialKernel(ctx, env, k)
	if err != nil {
		return err
	}
	defer c.Close()
	opts := magics.InjectOptions{KernelID: k.ID}
	if sock := daemonSocket(env, dirs); sock != "" {
		// As gpumem serve injects: re-injecting must not drop the daemon's
		// driver figures or its notebook alerts.
		opts.SidecarSocket = sock
		opts.AlertFile = kernelAlertFile(sock, k)
	}
	res, err := magics.Inject(ctx, c, opts)
	if err != nil {
		return fmt.Errorf("kernel %s (%s): %w", orDash(k.ID), orDash(k.Notebook), err)
	}
	fmt.Fprintf(env.Stdout, "kernel %s (%s): %s\n", orDash(k.ID), orDash(k.Notebook), textsafe.Line(res.String()))
	return nil
}

func runFree(ctx context.Context, env Env, args []string) error {
	fs := newFlagSet(env, "free", "KERNEL [--vars a,b] [--all] [--children [--pid N,...]] [--orphans [--pid N,...]] [--runtime-dir DIR ...]\n\n"+
		"KERNEL is at least "+fmt.Sprint(minKernelPrefix)+" characters of a kernel id, a notebook path (or its file name), or a connection file.\n"+
		"By default only caches are freed (gc, then the frameworks' caches): no user variable is touched.\n"+
		"--children ends the kernel's idle worker processes that hold GPU memory instead (never the kernel); one that computes\n"+
		"on a GPU, or whose work is unknown, is left running and named: --children --pid N,... ends those pids, and only them.\n"+
		"--orphans ends instead the processes of KERNEL's dead tree that gpumem serve left running (they were computing on a GPU).")
	var dirs dirList
	fs.Var(&dirs, "runtime-dir", "also look in this Jupyter runtime `dir` (repeatable; it must exist)")
	vars := fs.String("vars", "", "also delete these variables (comma-separated) and IPython's hidden references to them")
	all := fs.Bool("all", false, "delete every variable holding GPU memory")
	children := fs.Bool("children", false, "end the kernel's GPU-holding worker processes, never the kernel (needs gpumem serve)")
	asJSON := fs.Bool("json", false, "print the kernel's report as JSON")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for the kernel's current cell to finish")
	orphans := fs.Bool("orphans", false, "end the processes reclaim left running for KERNEL (the notebook's user or root only; through gpumem serve)")
	orphanPIDs := fs.String("pid", "", "with --orphans, only these processes; with --children, end these workers (and only them) even though they compute (comma-separated pids)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, "KERNEL"); err != nil {
		return err
	}
	if err := positive("timeout", *timeout); err != nil {
		return err
	}
	if err := longEnoughToAct(pos[0]); err != nil {
		return err
	}
	pids, err := parsePIDs(*orphanPIDs)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *orphans || (*orphanPIDs != "" && !*children) {
		if !*orphans || *vars != "" || *all || *children {
			return fmt.Errorf("%w: --pid goes with --orphans or --children, which end processes and take no --vars or --all", errUsage)
		}
		return runFreeOrphans(ctx, env, dirs, pos[0], pids, *asJSON)
	}
	if *orphanPIDs != "" && len(pids) == 0 {
		return fmt.Errorf("%w: --children --pid names no process", errUsage)
	}
	req := api.FreeRequest{All: *all, Vars: splitList(*vars)}
	if err := req.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *children && (req.All || len(req.Vars) > 0) {
		return fmt.Errorf("%w: --children frees the kernel's worker processes: use it without --vars and --all", errUsage)
	}
	k, err := resolveKernel(ctx, env, pos[0], dirs)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if *children {
		return freeChildren(ctx, env, dirs, k, api.FreeChildrenRequest{PIDs: pids}, *asJSON)
	}

	rep, err := freeCaches(ctx, env, dirs, k, req, *timeout)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.Stdout, rep)
	}
	// The kernel's report marked as its own, then the driver's figures.
	_, err = fmt.Fprintf(env.Stdout, "kernel %s (%s)\n%s\n", orDash(k.ID), orDash(k.Notebook), rep.Render())
	return err
}

// freeCaches frees k's caches (and req's variables): through the daemon
// when it runs (it adds the driver's figure), standalone otherwise. It says
// so when the kernel's current cell keeps the free waiting: a fresh client
// cannot know the kernel is busy before its first status, and the
// heartbeat tells a busy kernel (it answers) from a stopped, hung or dead
// one (it does not).
func freeCaches(ctx context.Context, env Env, dirs dirList, k discovery.Kernel, req api.FreeRequest, timeout time.Duration) (magics.FreeReport, error) {
	var rep magics.FreeReport
	waiting := time.AfterFunc(time.Second, func() {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := protocol.Ping(pctx, k.Connection); err != nil {
			fmt.Fprintf(env.Stderr, "gpumem: kernel %s does not answer its heartbeat (stopped, hung or dead: %v); "+
				"the free waits for it (up to %s)\n", orDash(k.ID), err, units.Duration(timeout))
			return
		}
		fmt.Fprintf(env.Stderr, "gpumem: kernel %s is busy (a cell is running); the free runs after it (waiting up to %s)\n", orDash(k.ID), units.Duration(timeout))
	})
	defer waiting.Stop()
	raw, err := freeViaDaemon(ctx, env, dirs, k.ID, req)
	var se *api.StatusError
	switch {
	case err == nil:
		if err := json.Unmarshal(raw, &rep); err != nil {
			return rep, fmt.Errorf("daemon's free reply: %w", err)
		}
		return rep, nil
	// No daemon, one that does not follow this kernel (outside its
	// runtime dirs), or a socket we do not trust (said in one line):
	// standalone.
	case errors.Is(err, api.ErrNoDaemon) || (errors.As(err, &se) && se.StatusCode == 404) || warnUntrusted(env, err):
		c, derr := dialKernel(ctx, env, k)
		if derr != nil {
			return rep, derr
		}
		defer c.Close()
		rep, err = magics.FreeCache(ctx, c, magics.FreeOptions{Vars: req.Vars, All: req.All})
		if err != nil {
			return rep, fmt.Errorf("kernel %s (%s): %w", orDash(k.ID), orDash(k.Notebook), err)
		}
		return rep, nil
	default:
		return rep, fmt.Errorf("kernel %s (%s): %w", orDash(k.ID), orDash(k.Notebook), err)
	}
}

// freeChildren ends a kernel's GPU-holding worker processes through the
// daemon, which alone knows the kernel's recorded tree and applies
// reclaim's policy to it: the idle ones, or the pids req confirms.
func freeChildren(ctx context.Context, env Env, dirs []string, k discovery.Kernel, req api.FreeChildrenRequest, asJSON bool) error {
	sock := daemonSocket(env, dirs)
	if sock == "" {
		return fmt.Errorf("kernel %s (%s): --children needs gpumem serve: it ends only processes it recorded in the kernel's "+
			"tree; start `gpumem serve` beside Jupyter and try again", orDash(k.ID), orDash(k.Notebook))
	}
	c := api.NewClient(sock)
	defer c.Close()
	raw, err := c.FreeChildren(ctx, k.ID, req)
	if err != nil {
		return fmt.Errorf("kernel %s (%s): %w", orDash(k.ID), orDash(k.Notebook), err)
	}
	var rep magics.ChildrenReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		return fmt.Errorf("daemon's reply: %w", err)
	}
	if asJSON {
		_, err = fmt.Fprintf(env.Stdout, "%s\n", raw)
	} else {
		// The kernel's text marked as its own, then the daemon's account.
		hint := func(pid int) string { return fmt.Sprintf("gpumem free %s --children --pid %d", k.ID, pid) }
		_, err = fmt.Fprintf(env.Stdout, "kernel %s (%s)\n%s\n", orDash(k.ID), orDash(k.Notebook), rep.Render(hint))
	}
	if err != nil {
		return err
	}
	// Each pid confirmed was asked to end: one that was not is a failure.
	notEnded := 0
	for _, pid := range req.PIDs {
		if !slices.ContainsFunc(rep.Ended, func(o magics.ChildOutcome) bool { return o.PID == pid }) {
			notEnded++
		}
	}
	if notEnded > 0 {
		return fmt.Errorf("kernel %s: %d of the %d pids confirmed were not ended (the report says why)", orDash(k.ID), notEnded, len(req.PIDs))
	}
	return nil
}

func freeViaDaemon(ctx context.Context, env Env, dirs []string, kernelID string, req api.FreeRequest) (json.RawMessage, error) {
	sock := daemonSocket(env, dirs)
	if sock == "" {
		return nil, api.ErrNoDaemon
	}
	c := api.NewClient(sock)
	defer c.Close()
	return c.Free(ctx, kernelID, req)
}

// daemonSocket is the socket of a gpumem serve for these runtime dirs, or "".
func daemonSocket(env Env, dirs []string) string {
	if s := env.getenv("GPUMEM_SOCKET"); s != "" {
		return s
	}
	for _, d := range discovery.RuntimeDirs(env.getenv, dirs) {
		p := filepath.Join(d, api.DefaultSocketName)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return p
		}
	}
	return ""
}

// kernelAlertFile is the alert file the daemon serving sock writes for
// k's user, as gpumem serve tells its kernels: a shared daemon (its socket
// open to every user) writes each user their own. k's user owns its
// connection file (its process is proven to run as that owner).
func kernelAlertFile(sock string, k discovery.Kernel) string {
	shared := false
	if fi, err := os.Stat(sock); err == nil {
		shared = fi.Mode().Perm()&0o006 != 0
	}
	uid := uint32(os.Geteuid())
	if fi, err := os.Stat(k.ConnectionFile); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid = st.Uid
		}
	}
	return daemon.AlertFile(sock, shared, uid)
}

// dialKernel attaches to k, naming it in errors.
func dialKernel(ctx context.Context, env Env, k discovery.Kernel) (*protocol.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := protocol.Dial(dctx, k.ConnectionFile, protocol.Options{})
	if err != nil {
		return nil, fmt.Errorf("kernel %s (%s, %s): %w", orDash(k.ID), orDash(k.Notebook), orDash(k.ConnectionFile), err)
	}
	return c, nil
}
