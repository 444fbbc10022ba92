package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/nvml/driver"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// watchFlag is --watch or --watch=INTERVAL.
type watchFlag struct {
	on       bool
	interval time.Duration
}

func (w *watchFlag) IsBoolFlag() bool { return true }
func (w *watchFlag) String() string {
	if w == nil || !w.on {
		return ""
	}
	return w.interval.String()
}
func (w *watchFlag) Set(v string) error {
	switch v {
	case "true":
		w.on, w.interval = true, 2*time.Second
		return nil
	case "false":
		w.on = false
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("--watch=%s: not a duration (try --watch=2s)", v)
	}
	if d < 100*time.Millisecond {
		return fmt.Errorf("--watch=%s: shorter than 100ms", v)
	}
	w.on, w.interval = true, d
	return nil
}

func runLs(ctx context.Context, env Env, args []string) error {
	fs := newFlagSet(env, "ls", "[--json] [--idle] [--wide] [--watch[=INTERVAL]] [--runtime-dir DIR ...]")
	asJSON := fs.Bool("json", false, "print JSON")
	wide := fs.Bool("wide", false, "print paths, commands and kernel ids whole (by default the table fits 100 columns)")
	idle := fs.Bool("idle", false, "idle GPU holders: each kernel's idle time (its server's last_activity, and its processes' last work on a GPU) beside its GPU memory, whether it computes, and what it held while computing nothing (GiB·h), largest first")
	var watch watchFlag
	fs.Var(&watch, "watch", "redraw every INTERVAL (default 2s) until Ctrl-C")
	var dirs dirList
	fs.Var(&dirs, "runtime-dir", "also scan this Jupyter runtime `dir` (repeatable; it must exist)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	width := tableWidth
	if *wide {
		width = 0
	}
	tm := newLsTiming(env)
	defer tm.print(env.Stderr)
	sampler, err := newReporter(ctx, env, dirs, tm)
	if err != nil {
		return err
	}
	if !watch.on {
		// One report, then exit: NVML is left to the process's exit.
		// nvmlShutdown detaches from every GPU, a few ms of the whole run
		// on an H200, and the driver releases an exiting process's
		// handles by itself. A daemon reporter's client goes the same way.
		rep, err := sampler.Report(ctx)
		if err != nil {
			return err
		}
		for _, w := range rep.Warnings {
			fmt.Fprintf(env.Stderr, "gpumem: %s\n", textsafe.Line(w))
		}
		defer tm.mark("output", time.Now())
		switch {
		case *asJSON:
			return writeJSON(env.Stdout, rep)
		case *idle:
			return writeIdle(env.Stdout, rep, time.Now(), width)
		}
		return writeLs(env.Stdout, rep, width)
	}
	defer sampler.Close()
	ticker := time.NewTicker(watch.interval)
	defer ticker.Stop()
	for {
		rep, err := sampler.Report(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var b strings.Builder
		if *asJSON {
			if err == nil {
				_ = writeJSON(&b, rep)
			}
		} else {
			// Home the cursor and clear, as watch(1) does, in one write.
			b.WriteString("\x1b[H\x1b[2J")
			fmt.Fprintf(&b, "Every %s: gpumem ls    %s\n\n", units.Duration(watch.interval), time.Now().Format("2006-01-02 15:04:05"))
			if err == nil && *idle {
				_ = writeIdle(&b, rep, time.Now(), width)
			} else if err == nil {
				_ = writeLs(&b, rep, width)
			}
		}
		if err != nil {
			fmt.Fprintf(&b, "gpumem: %s\n", errorText(err))
		}
		if _, werr := io.WriteString(env.Stdout, b.String()); werr != nil {
			return werr
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// reporter is where ls gets its figures: the daemon, or standalone.
type reporter interface {
	Report(ctx context.Context) (attribution.Report, error)
	Close()
}

// newReporter is the daemon serving the runtime dirs' socket, when it
// answers and is vouched for, else a standalone sampler.
func newReporter(ctx context.Context, env Env, dirs []string, tm *lsTiming) (reporter, error) {
	probe := time.Now()
	if sock := daemonSocket(env, dirs); sock != "" {
		d, err := dialDaemonReporter(ctx, sock)
		if err == nil {
			tm.mark("daemon_probe", probe)
			return d, nil
		}
		warnUntrusted(env, err) // then standalone, as without a daemon
	}
	tm.mark("daemon_probe", probe)
	return newLsSampler(env, dirs, tm)
}

// daemonReporter asks a running gpumem serve. Its first Report is the one
// fetched to learn whether the daemon answers.
type daemonReporter struct {
	c     *api.Client
	first *attribution.Report
}

// dialDaemonReporter fetches a first report; a daemon that refuses us
// (shared mode, not an admin), does not answer, or serves a socket we do
// not trust (an *api.UntrustedError) means standalone.
func dialDaemonReporter(ctx context.Context, sock string) (*daemonReporter, error) {
	c := api.NewClient(sock)
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rep, err := c.Notebooks(tctx)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &daemonReporter{c: c, first: &rep}, nil
}

func (r *daemonReporter) Report(ctx context.Context) (attribution.Report, error) {
	if r.first != nil {
		rep := *r.first
		r.first = nil
		return rep, nil
	}
	return r.c.Notebooks(ctx)
}

func (r *daemonReporter) Close() { r.c.Close() }

// lsSampler builds a Report standalone: discovery, NVML (or the simulated
// GPU) and /proc. NVML's start (Init, then the first process list: about
// 17 ms on an H200) runs while discovery asks the servers and reads /proc.
type lsSampler struct {
	env     Env
	dirs    []string
	fs      *procs.FS
	opened  chan struct{} // closed once gpus/openErr are set
	gpus    *nvml.Source
	openErr error
	tm      *lsTiming // nil unless GPUMEM_TIMING is set
	// servers are the Jupyter servers the last Report's discovery found.
	servers []discovery.Server
}

// lsTiming is how long each phase of one `gpumem ls` took, printed to
// stderr when GPUMEM_TIMING is set: the phase breakdown on a host where
// only the binary runs (a GPU host), beside the wall time a script sees
// (the difference is the process's start and exit). A nil *lsTiming
// records nothing.
type lsTiming struct {
	start  time.Time
	mu     sync.Mutex
	phases []string
}

func newLsTiming(env Env) *lsTiming {
	if env.getenv("GPUMEM_TIMING") == "" {
		return nil
	}
	return &lsTiming{start: time.Now()}
}

// mark records phase name as running from since until now.
func (t *lsTiming) mark(name string, since time.Time) {
	if t == nil {
		return
	}
	now := time.Now()
	t.mu.Lock()
	t.phases = append(t.phases, fmt.Sprintf("%s=%.2fms", name, float64(now.Sub(since))/1e6))
	t.mu.Unlock()
}

// print writes one line: "gpumem timing: phase=ms ... total=ms".
func (t *lsTiming) print(w io.Writer) {
	if t == nil {
		return
	}
	t.mark("total", t.start)
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(w, "gpumem timing: %s\n", strings.Join(t.phases, " "))
}

func newLsSampler(env Env, dirs []string, tm *lsTiming) (*lsSampler, error) {
	s := &lsSampler{env: env, dirs: dirs, fs: env.procFS(), opened: make(chan struct{}), tm: tm}
	go func() {
		defer close(s.opened)
		start := time.Now()
		s.gpus, s.openErr = driver.Open(driver.Options{FakeGPUFile: env.getenv("GPUMEM_FAKE_GPU")})
		s.tm.mark("nvml_open", start) // Init, dlopen included
	}()
	return s, nil
}

func (s *lsSampler) Close() {
	<-s.opened
	if s.gpus != nil {
		_ = s.gpus.Close()
	}
}

func (s *lsSampler) Report(ctx context.Context) (attribution.Report, error) {
	var g struct {
		snap nvml.Snapshot
		err  error
	}
	sampled := make(chan struct{}) // closed once g is set
	go func() {
		defer close(sampled)
		<-s.opened
		if s.openErr != nil {
			g.err = s.openErr
			return
		}
		start := time.Now()
		g.snap, g.err = s.gpus.Sample(ctx)
		s.tm.mark("nvml_sample", start)
	}()
	// Discovery reads the argv of the servers' descendants and of the GPU
	// processes' lineage only (NewScopedProcFinder): a kernel launched
	// outside the runtime dirs that holds no GPU memory, itself or below
	// it, is not ls's to list; every other kernel is, however many
	// processes the host runs. Only the launched kernels wait for NVML's
	// sample: the runtime dirs' are proven while it is taken.
	gpuLineage := func() []int {
		select {
		case <-sampled:
		case <-ctx.Done():
			return nil
		}
		if g.err != nil {
			return nil
		}
		t, err := s.fs.ScanLineage(attribution.DetailPIDs(g.snap, nil))
		if err != nil {
			return nil // observe reports it
		}
		pids := make([]int, 0, t.Len())
		for _, p := range t.All() {
			pids = append(pids, p.PID)
		}
		return pids
	}
	start := time.Now()
	res := discoverKernels(ctx, s.env, discovery.NewScopedProcFinder(s.fs, gpuLineage), s.dirs)
	s.servers = res.Servers
	s.tm.mark("discover", start)
	start = time.Now()
	<-sampled
	s.tm.mark("wait_gpus", start)
	if g.err != nil {
		return attribution.Report{}, g.err
	}
	kernels := make([]attribution.Kernel, 0, len(res.Kernels))
	for _, k := range res.Kernels {
		kernel := attribution.Kernel{ID: k.ID, ConnectionFile: k.ConnectionFile, Notebook: k.Notebook}
		if k.PIDProven { // an unproven process's tree is not the notebook's
			kernel.PID, kernel.StartTime = k.PID, k.PIDStart
		}
		kernels = append(kernels, kernel)
	}
	// Only the GPU processes, the kernels and their ancestors are read:
	// attributing them needs no more, however many processes the host runs.
	start = time.Now()
	obs, err := attribution.ObserveSnapshot(g.snap, lineage{s.fs}, kernels)
	s.tm.mark("observe", start)
	if err != nil {
		return attribution.Report{}, err
	}
	rep := obs.Report
	// What each kernel's server says of it: Finish makes its activity.
	activity := map[string]attribution.KernelActivity{}
	for _, k := range res.Kernels {
		if k.Server.URL != "" && !k.LastActivity.IsZero() {
			activity[k.ConnectionFile] = attribution.KernelActivity{ExecutionState: k.ExecutionState, LastActivity: k.LastActivity}
		}
	}
	attribution.Finish(&rep, attribution.FinishInput{Now: time.Now(), Table: obs.Table, Kernels: activity})
	for _, p := range res.Problems {
		rep.Warnings = append(rep.Warnings, p.Error())
	}
	return rep, nil
}

// lineage reads processes for ls (procs.FS.ScanLineage).
type lineage struct{ fs *procs.FS }

func (l lineage) ScanTree(details []int) (*procs.Table, error) { return l.fs.ScanLineage(details) }

// noGPUText is what ls says of a host where it sees no GPU, as the panel
// and the magics say it: "GPU n/a" and why, in the report's words (most
// often nvml.NoDriverWarning, which says the next step), else its own.
func noGPUText(rep attribution.Report) string {
	if len(rep.Warnings) > 0 {
		return "GPU n/a: " + strings.Join(rep.Warnings, "; ")
	}
	return "GPU n/a: no GPU seen; check with nvidia-smi where gpumem runs."
}

// writeLs renders a Report like nvidia-smi, but by notebook: per GPU a
// header, then its notebooks and other processes, biggest first, within
// width columns (paths and commands cut in their middle; 0: whole, and
// whole kernel ids).
func writeLs(w io.Writer, rep attribution.Report, width int) error {
	if len(rep.GPUs) == 0 {
		writeProse(w, "", 2, noGPUText(rep), width)
	}
	for _, g := range rep.GPUs {
		sim := ""
		if g.Simulated {
			sim = " (simulated)"
		}
		pct := 0.0
		if g.MemoryTotalBytes > 0 {
			pct = 100 * float64(g.MemoryUsedBytes) / float64(g.MemoryTotalBytes)
		}
		writeProse(w, "", 2, fmt.Sprintf("GPU %d  %s%s  %s / %s used (%.0f%%)  SM %s", g.Index, textsafe.Line(g.Name), sim,
			units.Bytes(g.MemoryUsedBytes), units.Bytes(g.MemoryTotalBytes), pct, gpuSM(g)), width)
		type row struct {
			cells []string
			bytes uint64
		}
		var rows, others []row
		for _, nb := range rep.Notebooks {
			if b, ok := onGPU(nb.PerGPU, g.Index); ok {
				// The column is the notebook's path, not its display name:
				// the terminal has room for where it lies, cut in its middle
				// to fit; a kernel without one is named by the KERNEL column.
				name := textsafe.Line(nb.Notebook)
				if name == "" {
					name = "(no notebook)"
				}
				rows = append(rows, row{[]string{name, kernelColumn(nb.KernelID, width),
					joinPIDs(nb.PIDs), orDash(nb.User), units.Bytes(b), smOn(nb.PerGPU, g.Index)}, b})
			}
		}
		for _, o := range rep.Other {
			if b, ok := onGPU(o.PerGPU, g.Index); ok {
				others = append(others, row{[]string{"other: " + orDash(o.Command), "-", strconv.Itoa(o.PID),
					orDash(o.User), units.Bytes(b), smOn(o.PerGPU, g.Index)}, b})
			}
		}
		bySize := func(r []row) {
			sort.SliceStable(r, func(i, j int) bool { return r[i].bytes > r[j].bytes })
		}
		bySize(rows)
		bySize(others)
		if len(rows)+len(others) > 0 {
			tb := newTable("  ", "NOTEBOOK", "KERNEL", "PIDS", "USER", "MEMORY", "SM").cutMiddle(0)
			for _, r := range append(rows, others...) {
				tb.add(r.cells...)
			}
			if err := tb.write(w, width); err != nil {
				return err
			}
		}
		for _, nb := range rep.Notebooks {
			for _, sc := range nb.StrayContexts {
				if sc.GPU == g.Index {
					writeStray(w, nb, sc, width)
				}
			}
		}
		fmt.Fprintf(w, "  notebooks %s, other %s, free %s\n\n", units.Bytes(g.NotebookBytes), units.Bytes(g.OtherBytes), units.Bytes(g.FreeBytes))
	}
	var idle []string
	for _, nb := range rep.Notebooks {
		if nb.GPUMemoryBytes == 0 {
			// As the table names notebooks: by path, the display name
			// for a kernel without one.
			name := textsafe.Line(nb.Notebook)
			if name == "" {
				name = textsafe.Line(nb.DisplayName)
			}
			idle = append(idle, name)
		}
	}
	if len(idle) > 0 {
		writeProse(w, "", 2, "Kernels without GPU memory: "+strings.Join(idle, ", "), width)
	}
	writeLeftRunning(w, rep, width)
	return nil
}

// writeStray flags a stray context of notebook nb under its GPU: a line
// with the process and the flag (the notebook's name cut in its middle to
// fit width), then attribution's sentences of why and how to avoid it.
func writeStray(w io.Writer, nb attribution.Notebook, sc attribution.StrayContext, width int) {
	name, label := orDash(nb.Notebook), textsafe.Line(sc.Label)
	line := func(name string) string { return fmt.Sprintf("  ! pid %d (%s): %s.", sc.PID, name, label) }
	if over := utf8.RuneCountInString(line(name)) - width; width > 0 && over > 0 {
		name = cutMiddleText(name, max(minCutWidth, utf8.RuneCountInString(name)-over))
	}
	fmt.Fprintln(w, line(name))
	writeProse(w, "    ", 0, textsafe.Line(sc.Why+" "+sc.Avoid), width)
}

// writeLeftRunning lists the processes reclaim left running, each by the
// daemon's sentence, and how to end them.
func writeLeftRunning(w io.Writer, rep attribution.Report, width int) {
	if len(rep.LeftRunning) == 0 {
		return
	}
	fmt.Fprintln(w, "Left running by reclaim (end one with gpumem free KERNEL --orphans):")
	for _, lr := range rep.LeftRunning {
		writeProse(w, "  ", 2, "kernel "+kernelColumn(lr.KernelID, width)+": "+textsafe.Line(lr.Message), width)
	}
}

// gpuSM is a GPU's SM utilization: its processes' sum, or unknown and why.
func gpuSM(g attribution.GPU) string {
	if g.Utilization == nil {
		if g.UtilizationMissing != "" {
			return "unknown (" + g.UtilizationMissing + ")"
		}
		return "unknown"
	}
	return fmt.Sprintf("%d%%", g.Utilization.SMPercent)
}

// smOn is the SM utilization on GPU index of per's entry: "unknown" when
// the GPU cannot say, never 0.
func smOn(per []attribution.GPUBytes, index int) string {
	for _, p := range per {
		if p.Index == index && p.Utilization != nil {
			return fmt.Sprintf("%d%%", p.Utilization.SMPercent)
		}
	}
	return "unknown"
}

// kernelColumn is a kernel id as a table shows it: its first 8 characters
// (enough for any command that takes a prefix), whole when the table is
// not fitted (--wide).
func kernelColumn(id string, width int) string {
	id = textsafe.Line(id)
	if width <= 0 {
		return id
	}
	return shortID(id)
}

func onGPU(per []attribution.GPUBytes, index int) (uint64, bool) {
	for _, p := range per {
		if p.Index == index {
			return p.Bytes, true
		}
	}
	return 0, false
}

// shortID shows the first 8 bytes of a kernel id (of a file name: any
// bytes), safe for a terminal.
func shortID(id string) string {
	if len(id) > 8 {
		id = id[:8]
	}
	return textsafe.Line(id)
}

func joinPIDs(pids []int) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.Itoa(p)
	}
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}
