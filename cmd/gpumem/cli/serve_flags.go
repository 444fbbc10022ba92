package cli

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/daemon"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/metrics"
)

// serveFlags are gpumem serve's flags as given, before any is checked.
type serveFlags struct {
	fs *flag.FlagSet // to ask which flags were given

	dirs             dirList
	interval         time.Duration
	rescan           time.Duration
	reclaim          bool
	grace            time.Duration
	computeWindow    time.Duration
	computeThreshold uint
	reclaimUnknown   string
	allUsers         bool
	everyUser        bool
	podKernels       bool
	onlyUsers        stringList
	socket           string
	socketMode       string
	listen           string
	allowRemote      bool
	notebookLabel    bool
	metricsToken     string
	threshold        float64
	noNotebookAlerts bool
	noInject         bool
	cullIdle         time.Duration
	cullGPUIdle      time.Duration
	cullMin          string
	cullAction       string
	cullWarn         time.Duration
	cullUsers        string
	cullExempt       string
	tokenURLs        stringList
	logFormat        string
	logLevel         string
	exitWith         int
	kube             *kubeFlags
}

// parseServeFlags parses serve's command line: flags only, no arguments.
func parseServeFlags(env Env, args []string) (*serveFlags, error) {
	fs := newFlagSet(env, "serve", "[flags]")
	f := &serveFlags{fs: fs}
	f.define(env)
	setFlagGroups(env, fs, "[flags]", serveFlagGroups)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return nil, err
	}
	if err := wantArgs(fs, pos); err != nil {
		return nil, err
	}
	return f, nil
}

// define declares serve's flags on f.fs, each into its field of f.
func (f *serveFlags) define(env Env) {
	fs := f.fs
	fs.Var(&f.dirs, "runtime-dir", "also watch this Jupyter runtime `dir` (repeatable; it must exist)")
	fs.DurationVar(&f.interval, "interval", time.Second, "how often to sample GPU memory")
	fs.DurationVar(&f.rescan, "rescan", 5*time.Second, "how often to rescan the runtime dirs besides inotify events (a deleted dir, a missed event)")
	fs.BoolVar(&f.reclaim, "reclaim", true, "end orphans of a restarted or shut-down kernel that still hold GPU memory (false: only report them)")
	fs.DurationVar(&f.grace, "reclaim-grace", 5*time.Second, "how long a dead kernel's survivors are watched for GPU work before any is ended, and the time between SIGTERM and SIGKILL when reclaiming")
	fs.DurationVar(&f.computeWindow, "compute-window", time.Minute, "how far back \"computing on a GPU\" looks: a process computes when at least 2 of its readings in this window reach --compute-threshold (reclaim looks from this long before the kernel's exit)")
	fs.UintVar(&f.computeThreshold, "compute-threshold", 1, "SM or memory busy percentage that makes a reading count as work on a GPU (1 to 100)")
	fs.StringVar(&f.reclaimUnknown, "reclaim-unknown", daemon.ReclaimKeep, "what reclaim does with a survivor whose GPU utilization is unknown (MIG, a driver without per-process utilization): keep (leave it running) or end")
	fs.BoolVar(&f.allUsers, "reclaim-all-users", false, "as root, also reclaim other users' orphans")
	fs.BoolVar(&f.everyUser, "all-users", false, "as root, find and watch every user's kernels (their runtime dirs, kernel processes, Jupyter servers); rescans every 2s unless --rescan says otherwise")
	fs.BoolVar(&f.podKernels, "pod-kernels", false, "as root on a Kubernetes node with the host's pids (hostPID): also find, attach to, inject into and reclaim for the kernels inside this node's pods; reads every pod's connection keys: see deploy/helm/gpumem/README.md; rescans every 2s unless --rescan says otherwise")
	fs.Var(&f.onlyUsers, "users", "with --all-users, only the kernels of this `user` (repeatable)")
	fs.StringVar(&f.socket, "socket", "", "the local API's unix socket (default gpumem.sock in the runtime dir)")
	fs.StringVar(&f.socketMode, "socket-mode", "private", "private (0600, this user only) or shared (0666, callers identified by SO_PEERCRED)")
	fs.StringVar(&f.listen, "listen", "", "serve Prometheus /metrics on this address (e.g. 127.0.0.1:9464)")
	fs.BoolVar(&f.allowRemote, "listen-allow-remote", false, "allow --listen on an address that is not loopback")
	fs.BoolVar(&f.notebookLabel, "metrics-notebook-label", true, "export per-notebook series (kernel_id, notebook labels); false keeps only per-user series, for large fleets")
	fs.StringVar(&f.metricsToken, "metrics-token-file", "", "serve per-notebook series only to scrapes with \"Authorization: Bearer <the token in this file>\" (a file of the daemon's user, mode 600); in shared mode (--socket-mode shared or --all-users) they are served only so")
	fs.Float64Var(&f.threshold, "alert-threshold", 0.8, "warn when a GPU's used memory passes this fraction of its total (0 disables)")
	fs.BoolVar(&f.noNotebookAlerts, "no-notebook-alerts", false, "don't print alerts in notebooks")
	fs.BoolVar(&f.noInject, "no-inject", false, "don't inject the %gpumem magics into kernels")
	fs.DurationVar(&f.cullIdle, "cull-idle", 0, "cull kernels idle this long (by their server's last_activity and their processes' work on a GPU) that hold GPU memory (0: off)")
	fs.DurationVar(&f.cullGPUIdle, "cull-gpu-idle", 0, "cull kernels whose processes did no GPU work this long while holding --cull-min-memory, whatever their cells run "+
		"(a keep-alive cell is no use); a shutdown frees the caches first and warns again (0: off)")
	fs.StringVar(&f.cullMin, "cull-min-memory", "1GiB", "cull only kernels holding at least this much GPU memory (children included)")
	fs.StringVar(&f.cullAction, "cull-action", daemon.CullReport, "what culling does: report (log and count), free (cache-only free) or shutdown (through the kernel's server)")
	fs.DurationVar(&f.cullWarn, "cull-warn", 10*time.Minute, "warn in the notebook this long before culling; any use cancels")
	fs.StringVar(&f.cullUsers, "cull-users", "", "in shared mode, cull only these users' kernels (comma-separated; default all)")
	fs.StringVar(&f.cullExempt, "cull-exempt-users", "", "never cull these users' kernels (comma-separated)")
	fs.Var(&f.tokenURLs, "server-token-url", "send GPUMEM_SERVER_TOKEN to the servers under this URL (a port may be *: http://127.0.0.1:*/user/; repeatable; also GPUMEM_SERVER_TOKEN_URLS), and to no other")
	fs.StringVar(&f.logFormat, "log-format", "auto", "auto (readable on a terminal, JSON otherwise), json or console")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&f.exitWith, "exit-with-parent", 0, "the pid of this daemon's parent (the Jupyter server whose extension started it): when it exits, wait for its kernels to end, reclaim what they left, then stop")
	f.kube = addKubeFlags(fs, env)
}

// check refuses flags that contradict each other or are out of range, and
// settles --rescan's default, which depends on other flags. It runs before
// anything is read or started, so that a mistake costs nothing.
func (f *serveFlags) check() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"interval", f.interval}, {"rescan", f.rescan}} {
		if err := positive(d.name, d.v); err != nil {
			return err
		}
	}
	if f.grace < 0 {
		return fmt.Errorf("%w: --reclaim-grace=%v: want a duration of 0 or more", errUsage, f.grace)
	}
	if f.cullIdle < 0 {
		return fmt.Errorf("%w: --cull-idle=%v: want a duration above 0, or 0 to leave culling off", errUsage, f.cullIdle)
	}
	if f.cullGPUIdle < 0 {
		return fmt.Errorf("%w: --cull-gpu-idle=%v: want a duration above 0, or 0 to leave that rule off", errUsage, f.cullGPUIdle)
	}
	if f.cullIdle == 0 && f.cullGPUIdle == 0 {
		// Culling is off: a culling flag alone is a mistake, not a setting.
		for _, n := range []string{"cull-min-memory", "cull-action", "cull-warn", "cull-users", "cull-exempt-users"} {
			if flagGiven(f.fs, n) {
				return fmt.Errorf("%w: --%s applies to culling, which is off: give --cull-idle=DURATION or --cull-gpu-idle=DURATION too (e.g. --cull-idle=3h)", errUsage, n)
			}
		}
	}
	if len(f.onlyUsers) > 0 && !f.everyUser {
		return fmt.Errorf("%w: --users limits --all-users: give --all-users too", errUsage)
	}
	if f.podKernels && os.Geteuid() != 0 {
		return fmt.Errorf("%w: --pod-kernels needs root (with CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_KILL): it reads pods' files through their processes' roots and dials their kernels inside their network namespaces", errUsage)
	}
	if (f.everyUser || f.podKernels) && !flagGiven(f.fs, "rescan") {
		f.rescan = 2 * time.Second // a user who logs in is served within 5 s
	}
	return nil
}

// serveSettings are what serve's flags and environment come to once
// parsed and checked: the daemon's settings that are no path (the paths
// are made only once the daemon starts), and the logger.
type serveSettings struct {
	mode            api.Mode
	cull            daemon.CullConfig
	compute         daemon.ComputeConfig
	scrapeToken     string
	serverToken     string
	serverTokenURLs []discovery.TokenPattern
	log             zerolog.Logger
}

// settings parses and checks the flags' values that need more than a
// range (byte sizes, lists, the token file, the server token and its URLs,
// the logger): a mistake in any is a usage error, found before anything
// starts.
func (f *serveFlags) settings(env Env) (serveSettings, error) {
	var s serveSettings
	var err error
	if s.mode, err = api.ParseMode(f.socketMode); err != nil {
		return s, fmt.Errorf("%w: --socket-mode: %v", errUsage, err)
	}
	if f.threshold < 0 || f.threshold > 1 {
		return s, fmt.Errorf("%w: --alert-threshold=%v: want a fraction between 0 and 1", errUsage, f.threshold)
	}
	minBytes, err := units.ParseBytes(f.cullMin)
	if err != nil {
		return s, fmt.Errorf("%w: --cull-min-memory: %v", errUsage, err)
	}
	s.cull = daemon.CullConfig{Idle: f.cullIdle, GPUIdle: f.cullGPUIdle, MinMemory: minBytes, Action: f.cullAction, Warn: f.cullWarn,
		Users: splitList(f.cullUsers), ExemptUsers: splitList(f.cullExempt)}
	if err := s.cull.Validate(); err != nil {
		return s, fmt.Errorf("%w: %v", errUsage, err)
	}
	if f.metricsToken != "" {
		if s.scrapeToken, err = metrics.ReadTokenFile(f.metricsToken); err != nil {
			return s, fmt.Errorf("%w: --metrics-token-file: %v", errUsage, err)
		}
	}
	if s.serverToken, s.serverTokenURLs, err = serverToken(env, f.tokenURLs); err != nil {
		return s, fmt.Errorf("%w: %v", errUsage, err)
	}
	if s.serverToken != "" && len(s.serverTokenURLs) == 0 {
		return s, fmt.Errorf("%w: GPUMEM_SERVER_TOKEN is set, but no --server-token-url (or GPUMEM_SERVER_TOKEN_URLS) says which servers it is for: "+
			"a server file is its user's to write, so the token is sent only to the servers named", errUsage)
	}
	if f.computeThreshold < 1 || f.computeThreshold > 100 || f.computeWindow <= 0 {
		return s, fmt.Errorf("%w: --compute-threshold=%d --compute-window=%v: want a percentage from 1 to 100 and a positive window", errUsage, f.computeThreshold, f.computeWindow)
	}
	s.compute = daemon.ComputeConfig{Window: f.computeWindow, ThresholdPercent: uint32(f.computeThreshold), ReclaimUnknown: f.reclaimUnknown}
	if err := s.compute.Validate(); err != nil {
		return s, fmt.Errorf("%w: %v", errUsage, err)
	}
	if s.log, err = newLogger(env.Stderr, f.logFormat, f.logLevel); err != nil {
		return s, fmt.Errorf("%w: %v", errUsage, err)
	}
	return s, nil
}

// serveFlagGroups are the headings of gpumem serve -h.
var serveFlagGroups = []flagGroup{
	{"Sampling", []string{"interval", "runtime-dir", "rescan", "no-inject"}},
	{"Reclaim (orphans of restarted or shut-down kernels)", []string{"reclaim", "reclaim-grace", "reclaim-unknown", "reclaim-all-users"}},
	{"GPU work (what counts as computing, for reclaim and culling)", []string{"compute-window", "compute-threshold"}},
	{"Culling (idle kernels that hold GPU memory; off unless --cull-idle or --cull-gpu-idle)", []string{"cull-idle", "cull-gpu-idle", "cull-min-memory", "cull-action", "cull-warn", "cull-users", "cull-exempt-users"}},
	{"Alerts", []string{"alert-threshold", "no-notebook-alerts"}},
	{"Local API and metrics", []string{"socket", "listen", "listen-allow-remote", "metrics-notebook-label", "metrics-token-file"}},
	{"Shared host (root, many users)", []string{"all-users", "users", "socket-mode", "server-token-url"}},
	{"Kubernetes", []string{"kubernetes", "pod-kernels", "node-name", "user-labels", "server-labels", "kubernetes-sync-timeout"}},
	{"Lifetime (a daemon a Jupyter server started)", []string{"exit-with-parent"}},
	{"Logging", []string{"log-format", "log-level"}},
}
