// Package daemon is `gpumem serve`: it watches the Jupyter runtime dirs,
// attaches to every kernel as a second client, injects the %gpumem magics
// once per kernel process, samples GPU memory per process every interval,
// remembers every process seen in each kernel's tree, and when a kernel
// process restarts or shuts down ends the processes of its old tree that
// still hold GPU memory. Each sample is a list of named, timed steps
// (sample.go) whose report attribution.Finish completes: the daemon
// decides culls and keeps alert state, attribution words every alert. It
// serves the local API (sidecar/api, through apiBackend) and Prometheus
// metrics (sidecar/metrics).
//
// It talks to a kernel only on attach and on demand (each request shows the
// kernel busy and resets Jupyter's idle-cull clock); liveness comes from its
// iopub connection and /proc.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/cgroups"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/metrics"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// Config is `gpumem serve`'s flags.
type Config struct {
	RuntimeDirs []string // the first holds the socket by default
	Interval    time.Duration
	Rescan      time.Duration // safety-net rescan of the runtime dirs

	Reclaim         bool
	ReclaimGrace    time.Duration
	ReclaimAllUsers bool
	AllUsers        bool // as root, also watch every user's runtime dirs (Deps.UserDirs finds them)

	SocketPath string
	SocketMode api.Mode

	MetricsAddr        string // "" = no metrics listener
	MetricsAllowRemote bool
	MetricsNoNotebook  bool // no per-notebook series (kernel_id, notebook labels); per-user ones remain
	// MetricsToken, when set, is the bearer token a scrape needs for the
	// per-notebook series. In shared mode (a shared socket, or AllUsers)
	// they are served only with it: loopback is open to every local user.
	MetricsToken string

	AlertThreshold float64 // fraction of a GPU's memory; <= 0 disables
	NotebookAlerts bool

	InjectMagics bool

	// ServerToken (GPUMEM_SERVER_TOKEN) is sent to servers whose info
	// file holds no token and whose URL ServerTokenURLs names.
	ServerToken     string
	ServerTokenURLs []discovery.TokenPattern

	Cull CullConfig
	// Compute says what "computing on a GPU" means to reclaim, culling and
	// hoarding (compute_policy.go).
	Compute ComputeConfig
}

// Deps are the daemon's windows on the system, built by its caller (the
// composition root) and faked at these seams in unit tests.
type Deps struct {
	// GPUs reads GPU memory per process: NVML, or the simulated GPU.
	GPUs attribution.GPUSampler
	// Procs reads the process table and confirms exits.
	Procs ProcReader
	// Finder proves which process serves a connection file.
	Finder discovery.ProcessFinder
	// UserDirs finds every user's runtime dirs (AllUsers); nil: none.
	UserDirs func() ([]discovery.UserDir, []error)
	// Terminate ends a process (SIGTERM, then SIGKILL after grace) if its
	// start time is still start; nil means the real one, through a pidfd.
	Terminate func(ctx context.Context, pid int, start uint64, grace time.Duration) (killed bool, err error)
	// Pods names the Kubernetes pod of each process; nil off Kubernetes.
	Pods attribution.Pods
	// PodKernels, when set, also finds and follows the kernels inside this
	// node's pods (the daemon then needs hostPID and reads every pod's
	// connection keys); nil: only this host's runtime dirs. With it,
	// reclaim ends a dead kernel's orphans only inside that kernel's pod,
	// read from Cgroups.
	PodKernels PodKernelFinder
	Cgroups    cgroups.Reader
}

// ProcReader reads /proc: the whole table (procs.FS.ScanTree) and one
// process (procs.FS.Exited). A scan that lacks a process is no proof that
// it exited; Exited is: true only when /proc says the process is gone, its
// pid reused or it a zombie, an error when /proc cannot be read.
type ProcReader interface {
	attribution.ProcScanner
	Exited(pid int, start uint64) (bool, error)
}

func (c *Config) defaults() {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Rescan <= 0 {
		c.Rescan = 5 * time.Second
	}
	if c.ReclaimGrace <= 0 {
		c.ReclaimGrace = 5 * time.Second
	}
	if c.SocketMode == "" {
		c.SocketMode = api.ModePrivate
	}
	c.Compute.defaults()
}

// shared says whether users other than the daemon's own use this daemon:
// then what one of them may not see through the socket (another's
// notebooks and kernel ids) is not served to all of them on loopback.
func (c Config) shared() bool { return c.SocketMode == api.ModeShared || c.AllUsers }

// Daemon is one `gpumem serve`. Its state is kept by concern: what it
// reads the system through (deps), the kernels it follows, the report it
// publishes, the alert state, discovery's memory across scans, and the
// judgements that outlive a sample (history, compute, OOM, snapshots).
type Daemon struct {
	cfg     Config
	log     zerolog.Logger
	selfUID uint32
	// deps are the system's windows (New fills Terminate's default).
	deps    Deps
	metrics *metrics.Metrics

	mu      sync.Mutex
	kernels map[string]*kernelState // by connection file
	// evidence is, by connection file, what each kernel's magics last said
	// its frameworks hold per GPU: the stray-context flags' evidence (why.go).
	evidence map[string]attribution.FrameworkEvidence
	pub      published  // the report every face reads
	alerts   alertState // the threshold's crossings and the alert files

	wg       sync.WaitGroup // kernel and reclaim goroutines
	reclaims inflight       // reclaims under way, for Settle

	sampling samplingState
	problems problemLog

	hist *historyParts // figures over time and reclaim events: history.go
	// compute is GPU utilization over time: readings, verdicts, hoarding,
	// processes left running (compute.go).
	compute *computeState

	ooms      *oomLog        // out-of-memory errors reported by kernels: oom.go
	snapshots *snapshotStore // memory snapshots kernels handed over: snapshots.go
	// runContext is Run's context, for work the API starts that outlives
	// its request (a snapshot's reduction); Background before Run.
	runContext context.Context

	disc discoveryState
}

// published is the last sample's report, with what it was finished with.
// Guarded by Daemon.mu.
type published struct {
	last metrics.Snapshot
	// seq counts the reports kept in last; json is the one numbered
	// jsonSeq, encoded (see ReportJSON).
	seq     uint64
	json    []byte
	jsonSeq uint64
	// finished is what the last report was finished with (finishNow).
	finished attribution.FinishInput
}

// alertState is the threshold's state per GPU and the notebook alert files
// written. Guarded by Daemon.mu.
type alertState struct {
	over     map[int]bool // GPU index → over the threshold at the last sample
	episodes map[int]int  // GPU index → crossings up so far
	files    alertFiles   // alertfiles.go
}

// samplingState is the sampling loop's own.
type samplingState struct {
	// failures keeps a failing sample from logging every second.
	failures     failureLog
	memo         attribution.Memo // the last sample's report, while its inputs stay the same (observe.go)
	now          chan struct{}    // capacity 1: a sample is wanted before the next tick
	afterObserve func()           // test hook: runs in sample after /proc was read
}

// problemLog is when each problem text was last logged at warn.
type problemLog struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// discoveryState is what discovery keeps across scans.
type discoveryState struct {
	locks         *dirLocks
	serverBackoff discovery.ServerBackoff // servers that failed
	kernelFiles   discovery.KernelFiles   // connection files read
	rescan        func()                  // asks the watcher for a scan (set by Run)
}

// sampleSoon asks Run's loop for a sample now (coalesced).
func (d *Daemon) sampleSoon() {
	select {
	case d.sampling.now <- struct{}{}:
	default:
	}
}

// New checks cfg and prepares a Daemon over deps; Run starts it.
func New(cfg Config, deps Deps, log zerolog.Logger) (*Daemon, error) {
	cfg.defaults()
	if len(cfg.RuntimeDirs) == 0 {
		return nil, errors.New("no runtime dir to watch")
	}
	if err := checkAllUsers(cfg); err != nil {
		return nil, err
	}
	if cfg.ReclaimAllUsers && os.Geteuid() != 0 {
		return nil, errors.New("--reclaim-all-users needs root: only root may end other users' processes")
	}
	if err := cfg.Cull.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Compute.Validate(); err != nil {
		return nil, err
	}
	if deps.GPUs == nil || deps.Procs == nil || deps.Finder == nil {
		return nil, errors.New("daemon: GPUs, Procs and Finder are required")
	}
	if deps.PodKernels != nil && deps.Cgroups == nil {
		return nil, errors.New("daemon: PodKernels needs Cgroups, to reclaim only within a kernel's pod")
	}
	if deps.Terminate == nil {
		deps.Terminate = func(ctx context.Context, pid int, start uint64, grace time.Duration) (bool, error) {
			return terminate(ctx, deps.Procs, procID{pid, start}, grace)
		}
	}
	d := &Daemon{
		cfg:      cfg,
		log:      log,
		selfUID:  uint32(os.Geteuid()),
		deps:     deps,
		kernels:  map[string]*kernelState{},
		evidence: map[string]attribution.FrameworkEvidence{},
		alerts:   alertState{over: map[int]bool{}, episodes: map[int]int{}},
		sampling: samplingState{now: make(chan struct{}, 1)},
		problems: problemLog{last: map[string]time.Time{}},
		disc:     discoveryState{locks: newDirLocks(cfg.RuntimeDirs), rescan: func() {}},
	}
	perNotebook := !cfg.MetricsNoNotebook && (!cfg.shared() || cfg.MetricsToken != "")
	d.metrics = metrics.New(d, log, metrics.PerNotebook(perNotebook))
	if cfg.MetricsToken != "" {
		d.metrics.NotebooksOnlyWith(cfg.MetricsToken)
	}
	d.hist = newHistoryParts(cfg.Interval)
	d.ooms, d.snapshots, d.runContext = newOOMLog(), newSnapshotStore(), context.Background()
	d.compute = newComputeState(cfg.Compute, cfg.Interval, d.reclaimWatch(), d.hist.store.Options().CoarseWindow)
	return d, nil
}

// Run serves until ctx ends, then detaches from every kernel (leaving them
// untouched) and returns after all its goroutines have.
func (d *Daemon) Run(ctx context.Context) error {
	// The runtime dirs' locks and the socket first: a second daemon for
	// these dirs stops here, before it touches any kernel.
	defer d.disc.locks.close()
	if _, errs := d.disc.locks.lock(); len(errs) > 0 {
		return errors.Join(errs...)
	}
	ln, err := api.Listen(ctx, d.cfg.SocketPath, d.cfg.SocketMode)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d.runContext = ctx // before the API serves: its handlers read it
	var ms *metrics.Server
	if d.cfg.MetricsAddr != "" {
		if ms, err = metrics.Listen(ctx, d.cfg.MetricsAddr, d.cfg.MetricsAllowRemote, d.metrics.Handler(), d.log); err != nil {
			ln.Close()
			return err
		}
		d.log.Info().Str("addr", ms.Addr().String()).Msg("serving metrics")
		if d.cfg.shared() && d.cfg.MetricsToken == "" && !d.cfg.MetricsNoNotebook {
			d.log.Info().Msg("shared mode: /metrics serves no per-notebook series (kernel_id, notebook): every local user can read loopback; " +
				"--metrics-token-file serves them to scrapes bearing its token")
		}
	}
	// The watcher first: the kernels the first scan follows ask it for
	// scans.
	w := newDirWatcher(d.cfg.RuntimeDirs, d.cfg.Rescan)
	d.disc.rescan = w.signal
	// A first view before the API answers, so that no caller sees "no sample".
	d.scan(ctx)
	d.sample(ctx)
	var parts sync.WaitGroup
	errc := make(chan error, 3)
	sock := &socketKeeper{path: d.cfg.SocketPath, mode: d.cfg.SocketMode, errc: errc,
		srv: api.NewServer(d.api(), api.Options{Logger: d.log})}
	sock.serve(ctx, ln)
	if ms != nil {
		parts.Add(1)
		go func() {
			defer parts.Done()
			if err := ms.Serve(ctx); err != nil {
				errc <- fmt.Errorf("metrics: %w", err)
			}
		}()
	}
	parts.Add(2)
	go func() { defer parts.Done(); _ = w.Run(ctx) }()
	go func() { defer parts.Done(); d.discover(ctx, w, sock) }()

	d.log.Info().Strs("runtime_dirs", d.cfg.RuntimeDirs).Str("socket", d.cfg.SocketPath).
		Dur("interval", d.cfg.Interval).Bool("reclaim", d.cfg.Reclaim).Str("cull", d.cfg.Cull.summary()).Msg("gpumem serve started")

	ticker := time.NewTicker(d.cfg.Interval)
	defer ticker.Stop()
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-errc:
			runErr = err
			break loop
		case <-ticker.C:
			d.sample(ctx)
		case <-d.sampling.now:
			d.sample(ctx)
		}
	}
	cancel()
	// Discovery first: a scan still running may follow a kernel (d.wg) or
	// serve the socket anew (sock) until it returns.
	parts.Wait()
	// The API next: its handlers start work in d.wg (a snapshot's
	// reduction), which must not begin once d.wg is waited for.
	sock.wait()
	d.wg.Wait() // kernel goroutines close their clients: detached, kernels untouched
	d.closeSnapshots()
	d.removeAlertFiles()
	d.log.Info().Msg("gpumem serve stopped; kernels left untouched")
	return runErr
}

// missingGrace is how long a connection file must stay deleted before its
// kernel counts as shut down (ipykernel's rewrite takes milliseconds).
const missingGrace = 300 * time.Millisecond

// scan reconciles the kernels we know with the runtime dirs. A connection
// file that goes away (rm, a tmp cleaner, a deleted runtime dir) detaches
// the daemon from its kernel, but the kernel is over only when its process
// is: until then its tree stays its own, protected and attributed (sample
// retires it when the process exits).
//
// Only a kernel whose file a process of the file's owner serves or names
// is followed (see follows): a file is anyone's to write, and following
// each one costs a goroutine that dials it; the others are looked at again
// at each scan.
func (d *Daemon) scan(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, scanDeadline)
	defer cancel()
	d.addUserDirs()
	dirs := d.watchedDirs()
	res := discovery.Discover(dctx, discovery.Options{RuntimeDirs: dirs, Procs: knownFinder{d}, KernelFiles: &d.disc.kernelFiles,
		ServerToken: d.cfg.ServerToken, ServerTokenURLs: d.cfg.ServerTokenURLs,
		ServerTimeout: serverDeadline, Backoff: &d.disc.serverBackoff})
	if d.deps.PodKernels != nil {
		pods := d.deps.PodKernels.Find(dctx)
		res.Kernels = append(res.Kernels, pods.Kernels...)
		res.Problems = append(res.Problems, pods.Problems...)
	}
	for _, p := range res.Problems {
		d.problem(p)
	}
	present := map[string]discovery.Kernel{}
	for _, k := range res.Kernels {
		present[k.ConnectionFile] = k
	}
	pending := map[string]bool{}
	for _, f := range res.Pending {
		pending[f] = true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	for file, ks := range d.kernels {
		if _, ok := present[file]; !ok && !ks.fileGone && !pending[file] {
			d.fileMissingLocked(now, file, ks)
		} else {
			ks.missingSince = time.Time{}
		}
	}
	followed := d.followedPerUserLocked()
	for file, k := range present {
		d.foundLocked(ctx, file, k, dirs, followed)
	}
	d.disc.locks.release(d.kernelDirsLocked()) // a user dir's lock lasts as long as a kernel followed in it
}

// fileMissingLocked judges a followed kernel whose connection file the
// scan did not find: gone once it stays missing for missingGrace, then
// over (no process proven or naming it) or its processes protected until
// it exits. Called with d.mu held.
func (d *Daemon) fileMissingLocked(now time.Time, file string, ks *kernelState) {
	// ipykernel deletes and rewrites its file at start-up, so a scan
	// can meet it half-written or missing for a moment: look again
	// missingGrace later. A pod kernel's file is no path of ours: it
	// is looked at through its server's root (see podFileExists).
	if ks.pod != nil && d.podFileExists(ks) {
		ks.missingSince = time.Time{}
		return
	}
	// A kernel found outside the runtime dirs is one only while a
	// process names its file: with its process gone and none naming
	// the file (a killed KernelManager leaves /tmp/tmpXXXX.json
	// behind), it is over although the file stays.
	unnamed := ks.launched && ks.cur.isZero()
	if _, err := os.Stat(file); ks.pod == nil && !unnamed && !errors.Is(err, fs.ErrNotExist) {
		ks.missingSince = time.Time{}
		return
	}
	if ks.missingSince.IsZero() {
		ks.missingSince = now
		time.AfterFunc(missingGrace, d.disc.rescan)
		return
	}
	if now.Sub(ks.missingSince) < missingGrace {
		return
	}
	ks.cancel() // detach: nothing to attach to without the file
	switch {
	case unnamed:
		delete(d.kernels, file)
		d.log.Info().Str("kernel_id", ks.id).Str("notebook", ks.notebook).Str("connection_file", file).
			Msg("no process names the connection file any more: the kernel is over, not followed")
	case ks.cur.isZero():
		delete(d.kernels, file)
		d.log.Info().Str("kernel_id", ks.id).Str("notebook", ks.notebook).
			Msg("connection file removed; no kernel process was proven, nothing to follow")
	default:
		ks.fileGone = true
		d.log.Info().Str("kernel_id", ks.id).Str("notebook", ks.notebook).Int("pid", ks.cur.PID).
			Msg("connection file removed while the kernel process runs: its processes stay protected until it exits")
	}
}

// foundLocked follows a kernel the scan found, if new (and the user's
// limit allows) or written again, and takes its server's word on it.
// Called with d.mu held.
func (d *Daemon) foundLocked(ctx context.Context, file string, k discovery.Kernel, dirs []string, followed map[uint32]int) {
	ks, ok := d.kernels[file]
	switch {
	case !ok:
		if !d.mayFollowLocked(k, followed) {
			return
		}
		followed[k.FileUID]++
		ks = newKernelState(k)
		ks.launched = k.Pod == nil && !slices.ContainsFunc(dirs, func(d string) bool { return filepath.Clean(d) == filepath.Dir(file) })
		d.kernels[file] = ks
		d.followLocked(ctx, ks)
	case ks.fileGone:
		ks.fileGone = false // written again (the same kernel, or a new one)
		d.followLocked(ctx, ks)
	}
	// The server's word on the notebook survives the server: a reclaim
	// after the server went first still names it.
	if k.Notebook != "" {
		ks.notebook = k.Notebook
	}
	if k.ServerURL != "" {
		ks.serverURL = k.ServerURL
	}
	ks.fileUID, ks.fileID = k.FileUID, k.FileID
	if k.Pod != nil {
		ks.podWitness = procID{k.Pod.WitnessPID, k.Pod.WitnessStart}
	}
	// Zero when no server answered for it now: nothing stale is judged.
	ks.server, ks.execState, ks.lastActivity = k.Server, k.ExecutionState, k.LastActivity
	if k.PID > 0 && k.PIDProven {
		d.setKernelProcessLocked(ks, procID{k.PID, k.PIDStart})
	}
}

// followLocked starts the goroutine that attaches to ks and follows it.
func (d *Daemon) followLocked(ctx context.Context, ks *kernelState) {
	kctx, kcancel := context.WithCancel(ctx)
	ks.cancel = kcancel
	d.wg.Add(1) // runKernel ends it, or hands it on
	go d.runKernel(kctx, ks)
}

// knownFinder resolves only the kernels whose process the daemon does not
// know yet: a rescan need not read every process's fds again. Kernels are
// known by their connection file's path: another user's file of the same
// name is another kernel. It passes on the finder's ConnectionFileLister,
// so that the daemon follows the kernels launched with connection files
// outside the runtime dirs (KernelManager, nbclient, papermill, jupyter
// console, VS Code: /tmp/tmpXXXX.json), every kernel `gpumem kernels` lists.
type knownFinder struct{ d *Daemon }

// LaunchedConnectionFiles implements discovery.ConnectionFileLister.
func (f knownFinder) LaunchedConnectionFiles(runtimeDirs []string) ([]string, error) {
	lister, ok := f.d.deps.Finder.(discovery.ConnectionFileLister)
	if !ok {
		return nil, nil
	}
	return lister.LaunchedConnectionFiles(runtimeDirs)
}

func (f knownFinder) FindKernels(files []discovery.KernelFile) (map[string]discovery.Owner, error) {
	known := map[string]bool{}
	f.d.mu.Lock()
	for file, ks := range f.d.kernels {
		if !ks.cur.isZero() {
			known[file] = true
		}
	}
	f.d.mu.Unlock()
	var rest []discovery.KernelFile
	for _, kf := range files {
		if !known[kf.Path] || kf.Unparsed { // who still names a broken file
			rest = append(rest, kf)
		}
	}
	if len(rest) == 0 {
		return map[string]discovery.Owner{}, nil
	}
	return f.d.deps.Finder.FindKernels(rest)
}

// TCPListener implements discovery.ListenerFinder with the daemon's finder,
// when it is one (it reads the daemon's /proc).
func (f knownFinder) TCPListener(ip net.IP, port int) (procs.Listener, bool, error) {
	lf, ok := f.d.deps.Finder.(discovery.ListenerFinder)
	if !ok {
		return procs.Listener{}, false, errors.New("the daemon's process finder cannot say who listens on a port")
	}
	return lf.TCPListener(ip, port)
}

// Alive implements discovery.ProcessChecker through the daemon's finder,
// so that a server file is called deletable only when its process is
// gone. A finder that cannot tell counts every process as alive: never
// advise deleting a live server's file.
func (f knownFinder) Alive(pid int) bool {
	if pc, ok := f.d.deps.Finder.(discovery.ProcessChecker); ok {
		return pc.Alive(pid)
	}
	return true
}

// setKernelProcessLocked records that ks is now served by process id. A new
// identity while the old process still lives is ignored until /proc says the
// old one is gone (sample handles the transition).
func (d *Daemon) setKernelProcessLocked(ks *kernelState, id procID) {
	if ks.cur == id {
		return
	}
	if !ks.cur.isZero() {
		return // sample() retires the old process first, reclaiming its tree
	}
	ks.cur = id
	// Proven: it runs as the file's owner (observe keeps it current).
	ks.uid = ks.fileUID
	ks.recorded = map[procID]recordedProc{}
	ks.observedIn = nil
	d.log.Info().Str("kernel_id", ks.id).Str("notebook", ks.notebook).Int("pid", id.PID).Msg("kernel process")
}
