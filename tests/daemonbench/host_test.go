package daemonbench

// The host benchmark: `gpumem serve` on a host shaped as real shared hosts
// are, rather than as BenchmarkScale1000Kernels' 50 kernels a process:
//
//   - every kernel a process of its own (a fakekernel serving one kernel,
//     a session leader as jupyter_client makes kernels) with a worker
//     process in its session (DataLoader-like);
//   - thousands of other processes (sleepers, on no kernel's tree);
//   - 3,000 GPU processes on 8 simulated GPUs: the kernels, sleepers, and
//     1,000 pids that this /proc does not show (a container's, or an old
//     driver's host pids);
//   - --interval 1s.
//
//	DAEMONBENCH_BASE_BIN=/tmp/base-gpumem \
//	go test ./tests/daemonbench/ -run '^$' -bench Host -benchtime 1x -timeout 60m -v
//
// One fleet grows through the sizes (DAEMONBENCH_SIZES, default
// 100,300,1000 kernels) beside DAEMONBENCH_OTHERS (default 5,000) sleepers;
// at each size the daemon of this tree and, when DAEMONBENCH_BASE_BIN names
// one, another build (today's, for the ratios) run in turn on the same
// processes, in alternating order from one size to the next; with
// DAEMONBENCH_MOCK=1 so does this tree's daemon over go-nvml's mock of the
// same GPUs (package mocknvml): the figure of the product's NVML path,
// without the simulated file's read and parse. For each: the
// time until every kernel is attached and its process proven, from the
// daemon's start; after a 10 s settle, CPU and RSS over a 30 s window; the
// p99 of 300 GET /api/v1/notebooks; the load average with each
// (DAEMONBENCH_WINDOW=seconds: a longer window than 30 s). Every run
// also checks the daemon's figures: each kernel's GPU memory is its
// notebook's, every sleeper on the GPU is an other process, and the pids
// /proc does not show are named in a warning.
//
// DAEMONBENCH_PROFILE=dir has this tree's daemon write, at the largest
// size, a CPU profile of the steady window and heap profiles before and
// after it (GPUMEM_PROFILE_DIR) as dir/host-<n>-cpu.pprof, -heap-start.pprof
// and -heap.pprof (`go tool pprof -sample_index=alloc_space -base
// host-<n>-heap-start.pprof host-<n>-heap.pprof`: what the window allocated).
//
// The box must have room: the benchmark checks pid_max, the task limit and
// the memory available before it starts anything.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

const (
	hostGPUCount  = 8
	hostGPUProcs  = 3000
	hostInvisible = 1000
)

func envInts(name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return def
		}
		out = append(out, n)
	}
	return out
}

// hostRoom fails the benchmark before it starts anything when the box
// cannot hold tasks more tasks (pid_max, RLIMIT_NPROC) or memBytes more.
func hostRoom(b *testing.B, tasks int, memBytes uint64) {
	b.Helper()
	read := func(path string) string {
		data, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		return string(data)
	}
	pidMax, err := strconv.Atoi(strings.TrimSpace(read("/proc/sys/kernel/pid_max")))
	if err != nil {
		b.Fatal(err)
	}
	var threads int
	if f := strings.Fields(read("/proc/loadavg")); len(f) >= 4 {
		if _, total, ok := strings.Cut(f[3], "/"); ok {
			threads, _ = strconv.Atoi(total)
		}
	}
	if threads+tasks > pidMax*9/10 {
		b.Fatalf("pid_max is %d and %d tasks run: no room for %d more", pidMax, threads, tasks)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(6 /* RLIMIT_NPROC */, &lim); err == nil && lim.Cur != ^uint64(0) && uint64(threads+tasks) > lim.Cur {
		b.Fatalf("ulimit -u is %d: no room for %d more tasks", lim.Cur, tasks)
	}
	var avail uint64
	for _, line := range strings.Split(read("/proc/meminfo"), "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			avail = kb << 10
		}
	}
	if avail < 2*memBytes {
		b.Fatalf("%.0f MiB available: want twice the %.0f MiB the benchmark needs (the box is shared)", mib(avail), mib(memBytes))
	}
	b.Logf("room: pid_max %d, %d tasks running, %d to start; %.0f MiB available, about %.0f MiB needed",
		pidMax, threads, tasks, mib(avail), mib(memBytes))
}

// sleepers are n other processes: `sleep` children of one shell, in its
// process group, ended (the group) in Cleanup.
type sleepers struct {
	proc *testenv.Proc
	pids []int
}

func startSleepers(b *testing.B, dir string, n int) *sleepers {
	b.Helper()
	start := time.Now()
	script := fmt.Sprintf("for i in $(seq %d); do sleep 1000000 & done; echo ready; wait", n)
	p := testenv.Start(b, testenv.Env(dir), dir, "bash", "-c", script)
	testenv.Poll(b, 2*time.Minute, fmt.Sprintf("%d sleepers", n), func() bool { return strings.Contains(p.Output(), "ready") })
	s := &sleepers{proc: p}
	leader := p.Cmd.Process.Pid
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", leader, leader))
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			s.pids = append(s.pids, pid)
		}
	}
	if len(s.pids) != n {
		b.Fatalf("%d sleepers started, want %d", len(s.pids), n)
	}
	var rss uint64
	for _, pid := range s.pids[:10] {
		rss += rssOf(pid)
	}
	b.Logf("%d sleepers started in %v (VmRSS of one %.2f MiB, most of it shared pages)", n,
		time.Since(start).Round(time.Millisecond), mib(rss/10))
	return s
}

// hostFleet is the kernels, one fakekernel process each, with a worker.
type hostFleet struct {
	dir   string
	procs []*fakeProc
}

func (f *hostFleet) files() []string {
	var out []string
	for _, p := range f.procs {
		out = append(out, p.files...)
	}
	return out
}

func (f *hostFleet) pids() []int {
	out := make([]int, len(f.procs))
	for i, p := range f.procs {
		out[i] = p.pid()
	}
	return out
}

// grow starts kernels until there are n, a few at a time.
func (f *hostFleet) grow(b *testing.B, n int) {
	b.Helper()
	start := time.Now()
	from := len(f.procs)
	for len(f.procs) < n {
		var batch []*fakeProc
		for range min(16, n-len(f.procs)) {
			fp := launchFakeKernels(b, f.dir, fmt.Sprintf("host%04d", len(f.procs)+len(batch)), 1, 1)
			batch = append(batch, fp)
		}
		for _, fp := range batch {
			fp.waitReady(b)
		}
		f.procs = append(f.procs, batch...)
	}
	var rss, anon uint64
	sample := f.procs[from:min(len(f.procs), from+20)]
	for _, fp := range sample {
		r, a := rssAnon(fp.pid())
		rss, anon = rss+r, anon+a
	}
	b.Logf("%d kernel processes (one kernel and one worker each) started in %v; a kernel process's VmRSS %.2f MiB, of it private (RssAnon) %.2f MiB",
		n-from, time.Since(start).Round(time.Millisecond), mib(rss/uint64(len(sample))), mib(anon/uint64(len(sample))))
}

// rssAnon is a process's VmRSS and RssAnon in bytes.
func rssAnon(pid int) (rss, anon uint64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "RssAnon":
			anon = kb << 10
		}
	}
	return rss, anon
}

// hostLayout lays the GPU processes out on the GPUs: the kernels (512 MiB
// each, plus a little by pid so that no two are equal), then sleepers up
// to total-invisible visible processes, then invisible pids (above
// pid_max: no process can have them). It returns the layout and the
// sleepers on it.
func hostLayout(kernels, others []int, total, invisible int) (held []map[int]uint64, onGPU []int) {
	held = make([]map[int]uint64, hostGPUCount)
	for i := range held {
		held[i] = map[int]uint64{}
	}
	n := 0
	add := func(pid int, bytes uint64) {
		held[n%hostGPUCount][pid] = bytes
		n++
	}
	for _, pid := range kernels {
		add(pid, kernelBytes+uint64(pid)<<12)
	}
	for _, pid := range others {
		if n >= total-invisible {
			break
		}
		add(pid, 32<<20)
		onGPU = append(onGPU, pid)
	}
	pidMax := 4 << 20
	if data, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			pidMax = v
		}
	}
	for pid := pidMax + 1; n < total; pid++ {
		add(pid, 16<<20)
	}
	return held, onGPU
}

// kernelBytes is what each kernel holds, at least: a thousand fit on 8 GPUs.
const kernelBytes = 512 << 20

// hostRun is what one daemon did at one size.
type hostRun struct {
	build            string
	kernels          int
	attached, proven time.Duration
	attachLoad       float64
	steady           window
	p50, p99, pmax   time.Duration
	requestLoad      float64
}

// BenchmarkHost: see the file's comment.
func BenchmarkHost(b *testing.B) {
	sizes := envInts("DAEMONBENCH_SIZES", []int{100, 300, 1000})
	others := envInts("DAEMONBENCH_OTHERS", []int{5000})[0]
	largest := slices.Max(sizes)
	// Tasks: each kernel process has 5 threads with GOMAXPROCS=1, and a
	// worker; each sleeper is one. Memory: measured 1 MiB private per
	// kernel process, 0.2 MiB per sleeper, with kernel overhead.
	hostRoom(b, largest*6+others+200, uint64(largest)*(3<<20)+uint64(others)*(400<<10)+(1<<30))
	type build struct {
		name, bin string
		env       []string
	}
	builds := []build{{name: "tree", bin: gpumemBinary(b)}}
	if base := os.Getenv("DAEMONBENCH_BASE_BIN"); base != "" {
		builds = append(builds, build{name: "base", bin: base})
	}
	if os.Getenv("DAEMONBENCH_MOCK") == "1" {
		builds = append(builds, build{name: "mock", bin: mockNVMLBinary(b), env: []string{"GPUMEM_MOCK_NVML=1"}})
	}
	fakeKernelBinary(b)
	dir := b.TempDir()
	sl := startSleepers(b, dir, others)
	fleet := &hostFleet{dir: dir}
	var runs []hostRun
	for i, n := range sizes {
		fleet.grow(b, n)
		gpu := testenv.NewFakeGPU(b)
		held, onGPU := hostLayout(fleet.pids(), sl.pids, hostGPUProcs, hostInvisible)
		gpu.SetGPUs(b, held)
		order := slices.Clone(builds)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, bd := range order {
			b.Run(fmt.Sprintf("kernels=%d/%s", n, bd.name), func(b *testing.B) {
				profile := ""
				if dir := os.Getenv("DAEMONBENCH_PROFILE"); dir != "" && bd.name == "tree" && n == largest {
					profile = dir
				}
				r := runHost(b, bd.bin, bd.env, dir, gpu, fleet, onGPU, profile)
				r.build, r.kernels = bd.name, n
				runs = append(runs, r)
			})
		}
	}
	b.Logf("summary (load average with each figure):")
	for _, r := range runs {
		b.Logf("  %4d kernels, %-4s: attached %5.2f s, proven %5.2f s (load %.2f); CPU %.2f %% (schedstat %.2f %%), RSS mean %.1f MiB, max %.1f MiB (load %.2f → %.2f); /api/v1/notebooks p50 %.2f ms, p99 %.2f ms, max %.2f ms (load %.2f)",
			r.kernels, r.build, r.attached.Seconds(), r.proven.Seconds(), r.attachLoad, r.steady.cpuPercent(), r.steady.runPercent(),
			mib(r.steady.RSSMean), mib(r.steady.RSSMax), r.steady.LoadStart, r.steady.LoadEnd, ms(r.p50), ms(r.p99), ms(r.pmax), r.requestLoad)
	}
	for _, n := range sizes {
		var tree *hostRun
		others := map[string]*hostRun{}
		for i := range runs {
			if runs[i].kernels != n {
				continue
			}
			if runs[i].build == "tree" {
				tree = &runs[i]
			} else {
				others[runs[i].build] = &runs[i]
			}
		}
		ratio := func(a, b float64) float64 {
			if b == 0 {
				return 0
			}
			return a / b
		}
		for _, name := range []string{"base", "mock"} {
			other := others[name]
			if tree == nil || other == nil {
				continue
			}
			b.Logf("  %4d kernels, tree ÷ %s: attached %.2f, CPU %.2f (schedstat %.2f), RSS mean %.2f, p99 %.2f", n, name,
				ratio(tree.attached.Seconds(), other.attached.Seconds()), ratio(tree.steady.cpuPercent(), other.steady.cpuPercent()),
				ratio(tree.steady.runPercent(), other.steady.runPercent()), ratio(float64(tree.steady.RSSMean), float64(other.steady.RSSMean)),
				ratio(float64(tree.p99), float64(other.p99)))
		}
	}
}

// mockNVMLBinary builds ./tests/daemonbench/mocknvml, the daemon over
// go-nvml's mock, once (a test binary: see its package comment).
func mockNVMLBinary(b *testing.B) string {
	b.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := built["mocknvml"]; ok {
		return bin
	}
	bin := filepath.Join(b.TempDir(), "mocknvml")
	cmd := exec.Command("go", "test", "-c", "-o", bin, "./mocknvml")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		b.Fatalf("building the daemon over go-nvml's mock: %v", err)
	}
	built["mocknvml"] = bin
	return bin
}

// steadyWindow is how long the steady state is measured:
// DAEMONBENCH_WINDOW seconds (default 30). A longer one steadies the CPU
// figure on a shared box, and gives its profile more samples.
func steadyWindow() time.Duration {
	return time.Duration(envInts("DAEMONBENCH_WINDOW", []int{30})[0]) * time.Second
}

// runHost runs one daemon on the fleet and measures it.
func runHost(b *testing.B, bin string, env []string, dir string, gpu *testenv.FakeGPU, fleet *hostFleet, sleepersOnGPU []int, profileDir string) hostRun {
	b.Helper()
	files := fleet.files()
	env = slices.Clone(env)
	if profileDir != "" {
		env = append(env, "GPUMEM_PROFILE_DIR="+profileDir)
	}
	d := startDaemonBin(b, bin, dir, gpu, env, "--interval=1s")
	var r hostRun
	testenv.Poll(b, 3*time.Minute, "every kernel attached and proven", func() bool {
		if len(attachedAt(d, "attached")) < len(files) {
			return false
		}
		view := kernelView(b, d)
		for _, f := range files {
			if view[f] <= 0 {
				return false
			}
		}
		r.proven = time.Since(d.Started)
		return true
	})
	for _, t := range attachedAt(d, "attached") {
		r.attached = max(r.attached, t)
	}
	r.attachLoad = testenv.LoadAverage()
	b.Logf("from the daemon's start: every kernel attached at %v, proven (pid known) by %v; load %.2f",
		r.attached.Round(time.Millisecond), r.proven.Round(time.Millisecond), r.attachLoad)
	checkHostReport(b, d, fleet, sleepersOnGPU)

	time.Sleep(10 * time.Second) // settle: a measurement, not a wait for a condition
	if profileDir != "" {
		_ = d.Cmd.Process.Signal(syscall.SIGUSR1) // start the CPU profile
	}
	r.steady = measure(b, d, steadyWindow())
	if profileDir != "" {
		_ = d.Cmd.Process.Signal(syscall.SIGUSR2) // stop it, write the heap's
		for _, name := range []string{"cpu.pprof", "heap-start.pprof", "heap.pprof"} {
			src := filepath.Join(profileDir, name)
			testenv.Poll(b, 10*time.Second, "the profile "+src, func() bool {
				st, err := os.Stat(src)
				return err == nil && st.Size() > 0
			})
			dst := filepath.Join(profileDir, fmt.Sprintf("host-%d-%s", len(files), name))
			if err := os.Rename(src, dst); err != nil {
				b.Fatal(err)
			}
			b.Logf("profile: %s", dst)
		}
	}
	b.Logf("%d kernels, steady state: %v", len(files), r.steady)

	// A request as a client makes it, to the reply's last byte.
	sock := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.Socket)
	}}}
	defer sock.CloseIdleConnections()
	var lat []time.Duration
	for range 300 {
		start := time.Now()
		resp, err := sock.Get("http://" + api.SocketHost + "/api/v1/notebooks")
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lat = append(lat, time.Since(start))
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("/api/v1/notebooks: %d %v", resp.StatusCode, err)
		}
	}
	r.p50, r.p99, r.pmax = percentile(lat, 50), percentile(lat, 99), percentile(lat, 100)
	r.requestLoad = testenv.LoadAverage()
	b.Logf("/api/v1/notebooks: p50 %.2f ms, p99 %.2f ms, max %.2f ms; load %.2f", ms(r.p50), ms(r.p99), ms(r.pmax), r.requestLoad)

	b.ReportMetric(0, "ns/op")
	b.ReportMetric(r.attached.Seconds(), "all-attached-s")
	b.ReportMetric(r.proven.Seconds(), "all-proven-s")
	b.ReportMetric(r.steady.cpuPercent(), "cpu-%core")
	b.ReportMetric(r.steady.runPercent(), "schedstat-cpu-%core")
	b.ReportMetric(mib(r.steady.RSSMean), "rss-MiB")
	b.ReportMetric(mib(r.steady.RSSMax), "rss-max-MiB")
	b.ReportMetric(ms(r.p99), "notebooks-p99-ms")
	b.ReportMetric(r.steady.LoadEnd, "load1")
	return r
}

// checkHostReport fails the benchmark unless the daemon's report is right
// for the host: each kernel holds its GPU memory, each sleeper on the GPU
// is an other process, and the invisible pids are warned of.
func checkHostReport(b *testing.B, d *daemon, fleet *hostFleet, sleepersOnGPU []int) {
	b.Helper()
	var rep attribution.Report
	testenv.Poll(b, 30*time.Second, "every kernel's GPU memory attributed", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		rep, err = d.Client.Notebooks(ctx)
		if err != nil {
			return false
		}
		held := 0
		for _, nb := range rep.Notebooks {
			if nb.GPUMemoryBytes >= kernelBytes {
				held++
			}
		}
		return held == len(fleet.procs)
	})
	others := map[int]bool{}
	for _, o := range rep.Other {
		others[o.PID] = true
	}
	for _, pid := range sleepersOnGPU {
		if !others[pid] {
			b.Fatalf("sleeper %d on the GPU is not listed as an other process", pid)
		}
	}
	warned := false
	for _, w := range rep.Warnings {
		warned = warned || strings.Contains(w, "GPU processes not found in /proc")
	}
	if !warned {
		data, _ := json.Marshal(rep.Warnings)
		b.Fatalf("no warning names the pids /proc does not show: %s", data)
	}
}
