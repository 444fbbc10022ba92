package daemonbench

// The scale benchmarks: `gpumem serve` with a thousand kernels on a host of
// eight GPUs and 3,000 GPU processes, and under kernel churn.
//
//	go test ./tests/daemonbench/ -run '^$' -bench 'Scale|Churn' -benchtime 1x -timeout 30m -v
//
// Kernels are fakekernel processes (see its package doc): SCALE_PER_PROCESS
// (default 50) fake kernels per process, each with its own ports, key and
// connection file, proven by the daemon as it proves any kernel (the
// process owning the shell port, running as the file's owner, naming the
// file in its argv). A few real ipykernel kernels run among them. The GPU
// file lists every kernel process and fills up to 3,000 processes with the
// machine's other processes and pids that no process has.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// fakeProc is one fakekernel process and the kernels it serves.
type fakeProc struct {
	name    string
	cmd     *exec.Cmd
	files   []string
	record  string
	done    chan struct{}
	ready   chan bool // its first line was "ready"
	isReady bool
}

// startFakeKernels starts one fakekernel process serving n kernels in dir's
// runtime dir, and waits until it has written their files. It is stopped
// (SIGTERM: it deletes its files) in Cleanup unless stopped before.
func startFakeKernels(b *testing.B, dir, prefix string, n int) *fakeProc {
	b.Helper()
	fp := launchFakeKernels(b, dir, prefix, n, 0)
	fp.waitReady(b)
	return fp
}

// launchFakeKernels is startFakeKernels without the wait (waitReady), the
// process with workers worker processes of its own. It leads a session of
// its own, as kernels that jupyter_client starts do.
func launchFakeKernels(b *testing.B, dir, prefix string, n, workers int) *fakeProc {
	b.Helper()
	fp := &fakeProc{record: filepath.Join(dir, prefix+".record.json"), done: make(chan struct{}),
		ready: make(chan bool, 1), name: prefix}
	args := []string{"-record", fp.record, "-workers", strconv.Itoa(workers)}
	for i := range n {
		f := filepath.Join(dir, "runtime", fmt.Sprintf("kernel-%s-%04d.json", prefix, i))
		fp.files = append(fp.files, f)
		args = append(args, "-f", f)
	}
	if err := os.MkdirAll(filepath.Join(dir, "runtime"), 0o700); err != nil {
		b.Fatal(err)
	}
	fp.cmd = exec.Command(fakeKernelBinary(b), args...)
	fp.cmd.Env = testenv.Env(dir, "GOMAXPROCS=1")
	fp.cmd.Stderr = os.Stderr
	fp.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := fp.cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := fp.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		defer close(fp.done)
		sc := bufio.NewScanner(out)
		fp.ready <- sc.Scan() && sc.Text() == "ready"
		_, _ = io.Copy(io.Discard, out)
		_ = fp.cmd.Wait()
	}()
	b.Cleanup(fp.stop)
	return fp
}

// waitReady waits (60 s) until the process has written its files.
func (fp *fakeProc) waitReady(b *testing.B) {
	b.Helper()
	if fp.isReady {
		return
	}
	select {
	case ok := <-fp.ready:
		if !ok {
			b.Fatalf("fakekernel %s did not start", fp.name)
		}
		fp.isReady = true
	case <-time.After(60 * time.Second):
		b.Fatalf("fakekernel %s: not ready within 60 s", fp.name)
	}
}

func (fp *fakeProc) pid() int { return fp.cmd.Process.Pid }

// stop ends the process (it deletes its files) and waits for it.
func (fp *fakeProc) stop() {
	select {
	case <-fp.done:
		return
	default:
	}
	_ = fp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-fp.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-fp.cmd.Process.Pid, syscall.SIGKILL)
		<-fp.done
	}
}

// received asks the process for its record (SIGUSR1) and returns, for
// each connection file, what its kernel received.
func (fp *fakeProc) received(b *testing.B) map[string]map[string]int {
	b.Helper()
	_ = os.Remove(fp.record)
	if err := fp.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		b.Fatal(err)
	}
	var recs []struct {
		ConnectionFile string         `json:"connection_file"`
		Received       map[string]int `json:"received"`
	}
	testenv.Poll(b, 10*time.Second, "the fake kernels' record "+fp.record, func() bool {
		data, err := os.ReadFile(fp.record)
		return err == nil && json.Unmarshal(data, &recs) == nil
	})
	out := map[string]map[string]int{}
	for _, r := range recs {
		out[r.ConnectionFile] = r.Received
	}
	return out
}

// rssOf is a process's VmRSS in bytes (0 when gone).
func rssOf(pid int) uint64 {
	rss, _, err := testenv.ProcMemory(pid)
	if err != nil {
		return 0
	}
	return rss
}

// hostGPUs lays the kernel processes out on 8 simulated GPUs (1 GiB each,
// plus a little by pid so that no two are equal) and fills the GPUs up to
// total processes with this machine's other processes and then pids no
// process has (above pid_max).
func hostGPUs(kernelPIDs []int, total int) []map[int]uint64 {
	const gpus = 8
	held := make([]map[int]uint64, gpus)
	for i := range held {
		held[i] = map[int]uint64{}
	}
	taken := map[int]bool{}
	n := 0
	add := func(pid int, bytes uint64) {
		if taken[pid] {
			return
		}
		taken[pid] = true
		held[n%gpus][pid] = bytes
		n++
	}
	for _, pid := range kernelPIDs {
		add(pid, 1<<30+uint64(pid)<<12)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && n < total {
			add(pid, 64<<20)
		}
	}
	pidMax := 4 << 20
	if data, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			pidMax = v
		}
	}
	for pid := pidMax + 1; n < total; pid++ {
		add(pid, 32<<20)
	}
	return held
}

// scrapeMetrics fetches /metrics and returns its unlabelled samples, and how
// long the scrape took.
func scrapeMetrics(b *testing.B, port string) (map[string]float64, time.Duration) {
	b.Helper()
	start := time.Now()
	resp, err := http.Get("http://127.0.0.1:" + port + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] = f
		}
	}
	return out, took
}

// fdCount is how many fds pid has open.
func fdCount(b *testing.B, pid int) int {
	b.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		b.Fatal(err)
	}
	return len(entries)
}

// kernelView is the daemon's /api/v1/kernels by connection file.
func kernelView(b *testing.B, d *daemon) map[string]int {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ks, err := d.Client.Kernels(ctx)
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for _, k := range ks {
		out[k.ConnectionFile] = k.PID
	}
	return out
}

// attachedAt is when the daemon logged "attached" for each kernel id, after
// its start.
func attachedAt(d *daemon, msg string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, l := range d.LogsSince(0) {
		if l.Fields["message"] != msg {
			continue
		}
		if id, ok := l.Fields["kernel_id"].(string); ok {
			if _, seen := out[id]; !seen {
				out[id] = l.At.Sub(d.Started)
			}
		}
	}
	return out
}

func perProcess() int {
	if n, err := strconv.Atoi(os.Getenv("SCALE_PER_PROCESS")); err == nil && n > 0 {
		return n
	}
	return 50
}

// fleet is the kernels of a scale benchmark: fake ones and a few real.
type fleet struct {
	fakes []*fakeProc
	real  []*testenv.Kernel
	files []string // every connection file
	pids  []int    // every kernel process
}

func startFleet(b *testing.B, dir string, fakes, real int) *fleet {
	b.Helper()
	f := &fleet{}
	per := perProcess()
	start := time.Now()
	for i := 0; i < fakes; i += per {
		fp := startFakeKernels(b, dir, fmt.Sprintf("fake%03d", i/per), min(per, fakes-i))
		f.fakes = append(f.fakes, fp)
		f.files = append(f.files, fp.files...)
		f.pids = append(f.pids, fp.pid())
	}
	var rss uint64
	for _, fp := range f.fakes {
		rss += rssOf(fp.pid())
	}
	b.Logf("%d fake kernels in %d processes started in %v; their RSS together %.1f MiB",
		fakes, len(f.fakes), time.Since(start).Round(time.Millisecond), mib(rss))
	b.ReportMetric(mib(rss), "fake-kernels-rss-MiB")
	for range real {
		k := testenv.StartKernel(b, dir)
		testenv.WaitKernelListening(b, k.ConnectionFile, 60*time.Second)
		f.real = append(f.real, k)
		f.files = append(f.files, k.ConnectionFile)
		f.pids = append(f.pids, k.Proc.Cmd.Process.Pid)
	}
	return f
}

// BenchmarkScale1000Kernels: the daemon at --interval 1s with 1,000 kernels
// (997 fake, 3 real) on 8 GPUs listing 3,000 processes. Targets: CPU under
// 5 % of a core, RSS under 100 MiB, every kernel attached within 10 s of
// the daemon's start, /api/v1/notebooks p99 under 20 ms, a /metrics scrape
// under 50 ms.
func BenchmarkScale1000Kernels(b *testing.B) {
	const (
		total    = 1000
		real     = 3
		gpuProcs = 3000
		steady   = 30 * time.Second
	)
	testenv.Require(b, "ipykernel")
	dir := b.TempDir()
	f := startFleet(b, dir, total-real, real)
	gpu := testenv.NewFakeGPU(b)
	gpu.SetGPUs(b, hostGPUs(f.pids, gpuProcs))
	port := strconv.Itoa(testenv.FreePort(b))
	d := startDaemon(b, dir, gpu, "--interval=1s", "--listen=127.0.0.1:"+port)

	// Attached: the daemon's client answered (its log's "attached") and
	// its process is proven (/api/v1/kernels gives its pid).
	var proven time.Duration
	testenv.Poll(b, 3*time.Minute, "every kernel proven", func() bool {
		view := kernelView(b, d)
		for _, file := range f.files {
			if view[file] <= 0 {
				return false
			}
		}
		proven = time.Since(d.Started)
		return true
	})
	testenv.Poll(b, 3*time.Minute, "every kernel attached and injected", func() bool {
		return len(attachedAt(d, "attached")) >= total && len(attachedAt(d, "magics injected")) >= total
	})
	var lastAttach, lastInject time.Duration
	for _, t := range attachedAt(d, "attached") {
		lastAttach = max(lastAttach, t)
	}
	for _, t := range attachedAt(d, "magics injected") {
		lastInject = max(lastInject, t)
	}
	b.Logf("from the daemon's start: every kernel attached at %v, proven (pid known) by %v, injected at %v",
		lastAttach.Round(time.Millisecond), proven.Round(time.Millisecond), lastInject.Round(time.Millisecond))

	// Each fake kernel got its kernel_info and exactly one injection.
	bad := 0
	for _, fp := range f.fakes {
		for file, got := range fp.received(b) {
			if got["control/kernel_info_request"] == 0 || got["shell/execute_request"] != 1 {
				bad++
				if bad <= 5 {
					b.Logf("fake kernel %s received %v", file, got)
				}
			}
		}
	}
	if bad > 0 {
		b.Errorf("%d fake kernels did not get one kernel_info and one injection", bad)
	}

	time.Sleep(10 * time.Second) // settle: a measurement, not a wait for a condition
	b.ResetTimer()
	w := measure(b, d, steady)
	b.StopTimer()
	b.Logf("%d kernels, steady state: %v", total, w)

	// A request as a client makes it, to the reply's last byte; decoding
	// the JSON is the client's cost, not the daemon's, and is left out.
	sock := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", filepath.Join(dir, "runtime", api.DefaultSocketName))
	}}}
	defer sock.CloseIdleConnections()
	var nbLat, metLat []time.Duration
	for i := range 300 {
		start := time.Now()
		resp, err := sock.Get("http://" + api.SocketHost + "/api/v1/notebooks")
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		nbLat = append(nbLat, time.Since(start))
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("/api/v1/notebooks: %d %v", resp.StatusCode, err)
		}
		if i == 0 {
			var rep attribution.Report
			if err := json.Unmarshal(body, &rep); err != nil || len(rep.Notebooks) < total {
				b.Fatalf("/api/v1/notebooks lists %d notebooks (%v), want %d", len(rep.Notebooks), err, total)
			}
			b.Logf("/api/v1/notebooks: %d bytes", len(body))
		}
	}
	var m map[string]float64
	for range 30 {
		var took time.Duration
		m, took = scrapeMetrics(b, port)
		metLat = append(metLat, took)
	}
	b.Logf("/api/v1/notebooks: p50 %.2f ms, p99 %.2f ms, max %.2f ms; /metrics: p50 %.2f ms, max %.2f ms",
		ms(percentile(nbLat, 50)), ms(percentile(nbLat, 99)), ms(percentile(nbLat, 100)),
		ms(percentile(metLat, 50)), ms(percentile(metLat, 100)))
	b.Logf("daemon: %v goroutines, %d fds, last sample took %.1f ms; Go runtime: heap in use %.1f MiB, idle %.1f MiB "+
		"(%.1f released to the OS), stacks %.1f MiB, all obtained from the OS %.1f MiB; RSS %.1f MiB",
		m["go_goroutines"], fdCount(b, d.pid()), 1000*m["gpumem_sample_duration_seconds"],
		mib(uint64(m["go_memstats_heap_inuse_bytes"])), mib(uint64(m["go_memstats_heap_idle_bytes"])),
		mib(uint64(m["go_memstats_heap_released_bytes"])), mib(uint64(m["go_memstats_stack_inuse_bytes"])),
		mib(uint64(m["go_memstats_sys_bytes"])), mib(rssOf(d.pid())))
	if dir := os.Getenv("DAEMONBENCH_PERFDIR"); dir != "" {
		profile(b, d, dir)
	}

	b.ReportMetric(0, "ns/op")
	b.ReportMetric(w.cpuPercent(), "cpu-%core")
	b.ReportMetric(w.runPercent(), "schedstat-cpu-%core")
	b.ReportMetric(mib(w.RSSMean), "rss-MiB")
	b.ReportMetric(mib(w.RSSMax), "rss-max-MiB")
	b.ReportMetric(mib(w.Peak), "hwm-MiB")
	b.ReportMetric(lastAttach.Seconds(), "all-attached-s")
	b.ReportMetric(proven.Seconds(), "all-proven-s")
	b.ReportMetric(lastInject.Seconds(), "all-injected-s")
	b.ReportMetric(ms(percentile(nbLat, 50)), "notebooks-p50-ms")
	b.ReportMetric(ms(percentile(nbLat, 99)), "notebooks-p99-ms")
	b.ReportMetric(ms(percentile(metLat, 100)), "metrics-max-ms")
	b.ReportMetric(m["go_goroutines"], "goroutines")
	b.ReportMetric(m["gpumem_sample_duration_seconds"]*1000, "sample-ms")
	b.ReportMetric(testenv.LoadAverage(), "load1")
}

// daemonState is what a churn must not grow.
type daemonState struct {
	goroutines    float64
	fds           int
	rss, heap     uint64
	kernelsListed int
}

func (s daemonState) String() string {
	return fmt.Sprintf("%.0f goroutines, %d fds, RSS %.1f MiB, heap in use %.1f MiB, %d kernels listed",
		s.goroutines, s.fds, mib(s.rss), mib(s.heap), s.kernelsListed)
}

func stateOf(b *testing.B, d *daemon, port string) daemonState {
	b.Helper()
	m, _ := scrapeMetrics(b, port)
	return daemonState{goroutines: m["go_goroutines"], fds: fdCount(b, d.pid()), rss: rssOf(d.pid()),
		heap: uint64(m["go_memstats_heap_inuse_bytes"]), kernelsListed: len(kernelView(b, d))}
}

// BenchmarkChurn: 20 kernel starts and 20 stops a second for 60 s beside
// SCALE_CHURN_BASE (default 200) steady kernels; each churned kernel is a
// fakekernel process of its own that lives about a second, as a kernel
// that fails at once would. Before and after (once the daemon has let go
// of the churned kernels), its goroutines, fds, RSS and heap.
func BenchmarkChurn(b *testing.B) {
	const (
		rate   = 20
		period = 60 * time.Second
		live   = 20 // churned kernels alive at once: each lives live/rate s
	)
	base := 200
	if n, err := strconv.Atoi(os.Getenv("SCALE_CHURN_BASE")); err == nil && n > 0 {
		base = n
	}
	dir := b.TempDir()
	f := startFleet(b, dir, base, 0)
	gpu := testenv.NewFakeGPU(b)
	gpu.SetGPUs(b, hostGPUs(f.pids, 3000))
	port := strconv.Itoa(testenv.FreePort(b))
	d := startDaemon(b, dir, gpu, "--interval=1s", "--listen=127.0.0.1:"+port)
	testenv.Poll(b, 3*time.Minute, "the steady kernels injected", func() bool {
		return len(attachedAt(d, "magics injected")) >= base
	})
	time.Sleep(10 * time.Second) // settle
	before := stateOf(b, d, port)
	b.Logf("before: %v", before)

	b.ResetTimer()
	started, stopped := 0, 0
	var alive []*fakeProc
	tick := time.NewTicker(time.Second / rate)
	end := time.Now().Add(period)
	cpu0, _ := testenv.ProcCPU(d.pid())
	for time.Now().Before(end) {
		<-tick.C
		// Not waiting for each start keeps the rate; each is ready long
		// before its stop.
		fp := launchFakeKernels(b, dir, fmt.Sprintf("churn%05d", started), 1, 0)
		started++
		alive = append(alive, fp)
		if len(alive) > live {
			alive[0].waitReady(b)
			alive[0].stop()
			alive = alive[1:]
			stopped++
		}
	}
	tick.Stop()
	for _, fp := range alive {
		fp.waitReady(b)
		fp.stop()
		stopped++
	}
	cpu1, _ := testenv.ProcCPU(d.pid())
	b.StopTimer()
	mid := stateOf(b, d, port)
	b.Logf("churn: %d started, %d stopped in %v; daemon CPU %v (%.1f %% of a core); at its end: %v",
		started, stopped, period, cpu1-cpu0, 100*(cpu1-cpu0).Seconds()/period.Seconds(), mid)
	testenv.Poll(b, time.Minute, "the daemon to let go of the churned kernels", func() bool {
		return len(kernelView(b, d)) == base
	})
	time.Sleep(15 * time.Second) // settle: idle connections, timers and the GC
	after := stateOf(b, d, port)
	b.Logf("after:  %v", after)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(started), "kernels-started")
	b.ReportMetric(before.goroutines, "goroutines-before")
	b.ReportMetric(after.goroutines, "goroutines-after")
	b.ReportMetric(float64(before.fds), "fds-before")
	b.ReportMetric(float64(after.fds), "fds-after")
	b.ReportMetric(mib(before.rss), "rss-before-MiB")
	b.ReportMetric(mib(after.rss), "rss-after-MiB")
	b.ReportMetric(mib(before.heap), "heap-before-MiB")
	b.ReportMetric(mib(after.heap), "heap-after-MiB")
	b.ReportMetric(100*(cpu1-cpu0).Seconds()/period.Seconds(), "churn-cpu-%core")
}
