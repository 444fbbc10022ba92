// Package daemonbench measures the cost figures of `gpumem serve`,
// with the real binary (built without -race, on the first benchmark's
// demand), a real Notebook 6 server, real ipykernel kernels and a
// simulated-GPU file (GPUMEM_FAKE_GPU) listing their real pids.
//
// Run (about 4 minutes on a 2-core machine; results in docs/benchmarks/daemon.txt):
//
//	go test ./tests/daemonbench/ -run '^$' -bench . -benchtime 1x -timeout 30m
//
// The package has benchmarks only: `go test ./...` runs nothing here and
// builds no binary.
//
//   - BenchmarkServe50Kernels: the daemon at the default --interval 1s with
//     50 live kernels on one simulated GPU: CPU over a 30 s steady-state
//     window (utime+stime of /proc/<pid>/stat) as % of one core (target
//     < 2 %); also the exact on-CPU time from /proc/<pid>/task/*/schedstat,
//     since utime+stime are sampled at each 4 ms tick; and RSS (VmRSS,
//     VmHWM; target < 40 MiB).
//   - BenchmarkKernelStartToMagic: 20 sessions created one at a time with
//     the daemon running; from the kernel's connection file appearing
//     (inotify) to %gpumem registered in the kernel (target p50 < 500 ms),
//     split at the kernel's first kernel_info answer: the kernel's own start
//     and gpumem's part.
//   - BenchmarkRestartOrphansGone: a kernel's child started with
//     start_new_session=True and listed on the GPU survives a REST restart;
//     time until it is gone, for a child that exits on SIGTERM and one that
//     ignores it (SIGKILL after --reclaim-grace). The daemon first watches
//     the survivors for GPU work for the grace window (--reclaim-grace, 5 s):
//     targets grace + < 1 s and twice the grace + < 1 s.
//
// Each benchmark reports its figures with b.ReportMetric (ns/op is
// meaningless here and dropped) and logs the load average, since the
// machine may be shared; -v shows every sample. DAEMONBENCH_PERFDIR=dir
// adds, after the measurement, a 30 s `perf record -g` of the 50-kernel
// daemon there; DAEMONBENCH_LOGDIR=dir keeps each daemon's JSON log there
// as <benchmark>.log. Times taken from the log are those at which the
// benchmark read each line (zerolog's timestamps have whole seconds only).
package daemonbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/protocol"
)

// window is what the daemon used over one measurement window.
type window struct {
	Wall, CPU          time.Duration // CPU: utime+stime, sampled at each tick
	RunTime            time.Duration // on-CPU time from schedstat: exact
	RSSMean, RSSMax    uint64
	Peak               uint64 // VmHWM at the end: the peak over the daemon's life
	LoadStart, LoadEnd float64
	LogLines           int
}

func (w window) cpuPercent() float64 { return 100 * w.CPU.Seconds() / w.Wall.Seconds() }

func (w window) runPercent() float64 { return 100 * w.RunTime.Seconds() / w.Wall.Seconds() }

func (w window) String() string {
	return fmt.Sprintf("%v wall, %v CPU = %.2f %% of one core (schedstat: %v = %.2f %%); RSS mean %.1f MiB, max %.1f MiB, VmHWM %.1f MiB; "+
		"load average %.2f → %.2f; %d log lines",
		w.Wall.Round(time.Millisecond), w.CPU, w.cpuPercent(), w.RunTime.Round(time.Millisecond), w.runPercent(), mib(w.RSSMean), mib(w.RSSMax), mib(w.Peak),
		w.LoadStart, w.LoadEnd, w.LogLines)
}

// measure watches the daemon for d without talking to it: CPU from
// /proc/<pid>/stat before and after, RSS every 250 ms.
func measure(b *testing.B, dm *daemon, d time.Duration) window {
	b.Helper()
	pid := dm.pid()
	w := window{LoadStart: testenv.LoadAverage()}
	logs0 := dm.LogCount()
	cpu0, err := testenv.ProcCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	run0, err := testenv.ProcRunTime(pid)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var sum uint64
	var n int
	for time.Since(start) < d {
		rss, _, err := testenv.ProcMemory(pid)
		if err != nil {
			b.Fatalf("daemon: %v\n%s", err, dm.output())
		}
		sum += rss
		n++
		w.RSSMax = max(w.RSSMax, rss)
		<-tick.C
	}
	cpu1, err := testenv.ProcCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	run1, err := testenv.ProcRunTime(pid)
	if err != nil {
		b.Fatal(err)
	}
	w.Wall = time.Since(start)
	w.CPU = cpu1 - cpu0
	w.RunTime = run1 - run0
	_, w.Peak, err = testenv.ProcMemory(pid)
	if err != nil {
		b.Fatal(err)
	}
	w.RSSMean = sum / uint64(n)
	w.LoadEnd = testenv.LoadAverage()
	w.LogLines = dm.LogCount() - logs0
	return w
}

// BenchmarkServe50Kernels: the daemon's CPU and memory with 50 kernels.
func BenchmarkServe50Kernels(b *testing.B) {
	const (
		kernels = 50
		batch   = 5
		steady  = 30 * time.Second
	)
	testenv.Require(b, "notebook", "ipykernel", "jupyter_client")
	srv := testenv.StartServer(b, testenv.NotebookServer())
	reap := testenv.NewReaper(b, srv)
	gpu := testenv.NewFakeGPU(b)
	port := strconv.Itoa(testenv.FreePort(b))
	d := startDaemon(b, srv.Dir, gpu, "--listen=127.0.0.1:"+port) // defaults: --interval 1s, --log-level info

	idle := measure(b, d, 10*time.Second)
	b.Logf("no kernels: %v", idle)

	// Kernels in batches, each batch attached and injected before the next:
	// a kernel takes about 1 s of CPU to start.
	setupStart := time.Now()
	cpu0, err := testenv.ProcCPU(d.pid())
	if err != nil {
		b.Fatal(err)
	}
	var conns []string
	for i := 0; i < kernels; i += batch {
		var ids []string
		for j := i; j < min(i+batch, kernels); j++ {
			sess, _ := createSession(b, srv, fmt.Sprintf("bench/nb%02d.ipynb", j))
			ids = append(ids, sess.Kernel.ID)
			conns = append(conns, srv.ConnectionFile(sess.Kernel.ID))
		}
		for _, id := range ids {
			d.waitInjected(b, 2*time.Minute, id, srv.ConnectionFile(id))
		}
	}
	cpu1, err := testenv.ProcCPU(d.pid())
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d kernels started, attached and injected in %v; daemon CPU meanwhile %v",
		kernels, time.Since(setupStart).Round(time.Millisecond), cpu1-cpu0)

	held := map[int]uint64{}
	for _, cf := range conns {
		pid := testenv.KernelPID(b, cf)
		reap.Add(pid)
		held[pid] = 1<<30 + uint64(pid)<<12
	}
	gpu.SetGPUs(b, []map[int]uint64{held})
	testenv.Poll(b, 30*time.Second, "the daemon attributes all 50 kernels' GPU memory", func() bool {
		return len(d.notebookPIDs(b)) == kernels
	})
	// Let the kernels and the daemon settle (the last batch is seconds old):
	// this is a measurement, not a wait for a condition.
	time.Sleep(10 * time.Second)

	var wins []window
	b.ResetTimer()
	for range b.N {
		wins = append(wins, measure(b, d, steady))
	}
	b.StopTimer()
	var cpu, run, wall time.Duration
	var rssMean, rssMax, peak uint64
	for _, w := range wins {
		b.Logf("%d kernels, steady state: %v", kernels, w)
		cpu += w.CPU
		run += w.RunTime
		wall += w.Wall
		rssMean += w.RSSMean / uint64(len(wins))
		rssMax = max(rssMax, w.RSSMax)
		peak = max(peak, w.Peak)
	}
	b.Logf("daemon's last sample took %s (gpumem_sample_duration_seconds)", scrapeSampleDuration(b, port))
	if dir := os.Getenv("DAEMONBENCH_PERFDIR"); dir != "" {
		profile(b, d, dir)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu-%core")
	b.ReportMetric(100*run.Seconds()/wall.Seconds(), "schedstat-cpu-%core")
	b.ReportMetric(idle.cpuPercent(), "idle-cpu-%core")
	b.ReportMetric(mib(rssMean), "rss-MiB")
	b.ReportMetric(mib(rssMax), "rss-max-MiB")
	b.ReportMetric(mib(peak), "hwm-MiB")
	b.ReportMetric(testenv.LoadAverage(), "load1")
}

// profile records, after the measurement (perf's own cost would count in
// it), 30 s of the daemon's steady state with `perf record -g` into
// dir/serve50.perf.data, for `perf report -i ... --no-children`.
func profile(b *testing.B, d *daemon, dir string) {
	out := filepath.Join(dir, "serve50.perf.data")
	cmd := exec.Command("perf", "record", "-F", "499", "-g", "-p", strconv.Itoa(d.pid()), "-o", out, "--", "sleep", "30")
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Errorf("perf record: %v\n%s", err, msg)
		return
	}
	b.Logf("perf profile of 30 s of steady state: %s", out)
}

// scrapeSampleDuration reads gpumem_sample_duration_seconds from /metrics.
func scrapeSampleDuration(b *testing.B, port string) string {
	resp, err := http.Get("http://127.0.0.1:" + port + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "gpumem_sample_duration_seconds "); ok {
			if s, err := strconv.ParseFloat(v, 64); err == nil {
				return time.Duration(s * float64(time.Second)).String()
			}
		}
	}
	return "?"
}

// connFileWatch records when each kernel connection file first appeared in
// a runtime dir (inotify, as the daemon learns of it).
type connFileWatch struct {
	mu   sync.Mutex
	seen map[string]time.Time // base name → first event
}

func watchConnFiles(b *testing.B, dir string) *connFileWatch {
	b.Helper()
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		b.Fatal(err)
	}
	if err := fw.Add(dir); err != nil {
		b.Fatal(err)
	}
	cw := &connFileWatch{seen: map[string]time.Time{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range fw.Events {
			at := time.Now()
			name := filepath.Base(ev.Name)
			if ev.Op&(fsnotify.Create|fsnotify.Write) == 0 || !strings.HasPrefix(name, "kernel-") {
				continue
			}
			cw.mu.Lock()
			if _, ok := cw.seen[name]; !ok {
				cw.seen[name] = at
			}
			cw.mu.Unlock()
		}
	}()
	go func() {
		for range fw.Errors {
		}
	}()
	b.Cleanup(func() { _ = fw.Close(); <-done })
	return cw
}

func (cw *connFileWatch) appeared(b *testing.B, connFile string) time.Time {
	b.Helper()
	var at time.Time
	testenv.Poll(b, 30*time.Second, "connection file "+connFile, func() bool {
		cw.mu.Lock()
		defer cw.mu.Unlock()
		var ok bool
		at, ok = cw.seen[filepath.Base(connFile)]
		return ok
	})
	return at
}

// BenchmarkKernelStartToMagic: how soon a new kernel has %gpumem.
func BenchmarkKernelStartToMagic(b *testing.B) {
	const samples = 20
	testenv.Require(b, "notebook", "ipykernel", "jupyter_client")
	srv := testenv.StartServer(b, testenv.NotebookServer())
	testenv.NewReaper(b, srv)
	gpu := testenv.NewFakeGPU(b)
	d := startDaemon(b, srv.Dir, gpu, "--log-level=debug") // debug: attach retries are logged
	files := watchConnFiles(b, srv.RuntimeDir())

	var fileToMagic, postToMagic, fileToReady, readyToMagic, readyToAttached, attachedToInjected []time.Duration
	var retries []int
	falseShutdowns := 0
	var details []string // logged after the summary: without -v only 10 lines show
	load0 := testenv.LoadAverage()
	b.ResetTimer()
	for i := range b.N {
		for s := range samples {
			from := d.LogCount()
			sess, posted := createSession(b, srv, fmt.Sprintf("start/%d-%02d.ipynb", i, s))
			cf := srv.ConnectionFile(sess.Kernel.ID)
			appeared := files.appeared(b, cf)
			c, ready := dialKernel(b, cf)
			magic := waitMagic(b, c, 60*time.Second)
			_ = c.Close()
			attached := d.WaitLogSince(b, 10*time.Second, from, "attached", map[string]any{"kernel_id": sess.Kernel.ID})
			injected := d.WaitLogSince(b, 10*time.Second, from, "magics injected", map[string]any{"kernel_id": sess.Kernel.ID})
			n := d.countLogs(from, "attach failed", sess.Kernel.ID)
			falseShutdowns += d.countLogs(from, "kernel shut down (connection file removed)", sess.Kernel.ID)
			fileToMagic = append(fileToMagic, magic.Sub(appeared))
			postToMagic = append(postToMagic, magic.Sub(posted))
			fileToReady = append(fileToReady, ready.Sub(appeared))
			readyToMagic = append(readyToMagic, magic.Sub(ready))
			readyToAttached = append(readyToAttached, attached.At.Sub(ready))
			attachedToInjected = append(attachedToInjected, injected.At.Sub(attached.At))
			retries = append(retries, n)
			details = append(details, fmt.Sprintf("kernel %2d: file→ready %4.0f ms, ready→attached %5.0f ms (%d failed attaches), attached→injected %4.0f ms, "+
				"ready→magic %5.0f ms, file→magic %5.0f ms (file %+.0f ms after the POST returned)",
				s, ms(ready.Sub(appeared)), ms(attached.At.Sub(ready)), n, ms(injected.At.Sub(attached.At)),
				ms(magic.Sub(ready)), ms(magic.Sub(appeared)), ms(appeared.Sub(posted))))
		}
	}
	b.StopTimer()
	b.Logf("load average %.2f → %.2f; -v shows every sample", load0, testenv.LoadAverage())
	for _, l := range details {
		b.Log(l)
	}
	b.ReportMetric(0, "ns/op")
	report(b, "file-to-magic", fileToMagic, true)
	report(b, "post-to-magic", postToMagic, false)
	report(b, "file-to-ready", fileToReady, false)
	report(b, "ready-to-magic", readyToMagic, true)
	report(b, "ready-to-attached", readyToAttached, false)
	report(b, "attached-to-injected", attachedToInjected, false)
	total := 0
	for _, n := range retries {
		total += n
	}
	b.ReportMetric(float64(total)/float64(len(retries)), "failed-attaches/kernel")
	// A live kernel taken for shut down: see docs/benchmarks/daemon.txt.
	b.ReportMetric(float64(falseShutdowns), "false-shutdowns")
}

// sigtermIgnored reports whether pid ignores SIGTERM (SigIgn in its status).
func sigtermIgnored(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(15-1)) != 0
		}
	}
	return false
}

// BenchmarkRestartOrphansGone: a restarted kernel's orphan holding GPU
// memory is ended.
func BenchmarkRestartOrphansGone(b *testing.B) {
	const samples = 5
	testenv.Require(b, "notebook", "ipykernel", "jupyter_client")
	srv := testenv.StartServer(b, testenv.NotebookServer())
	reap := testenv.NewReaper(b, srv)
	gpu := testenv.NewFakeGPU(b)
	d := startDaemon(b, srv.Dir, gpu, "--log-level=debug")
	sess, _ := createSession(b, srv, "restart/orphans.ipynb")
	cf := srv.ConnectionFile(sess.Kernel.ID)
	c, _ := dialKernel(b, cf)
	waitMagic(b, c, 60*time.Second)

	children := map[string]string{
		"term":   "import time; time.sleep(600)",
		"ignore": "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
	}
	gone := map[string][]time.Duration{}
	toSIGTERM := map[string][]time.Duration{}
	var magicBack, newReady, readyToInjected []time.Duration
	falseShutdowns := 0
	var details []string
	kernel := testenv.KernelPID(b, cf)
	reap.Add(kernel)
	load0 := testenv.LoadAverage()
	b.ResetTimer()
	for range b.N {
		for s := range 2 * samples {
			kind := "term"
			if s%2 == 1 {
				kind = "ignore"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			r, err := c.Execute(ctx, "import subprocess, sys\n"+
				"_w = subprocess.Popen([sys.executable, '-c', "+strconv.Quote(children[kind])+"], start_new_session=True)",
				protocol.ExecuteOptions{UserExpressions: map[string]string{"pid": "_w.pid"}})
			cancel()
			if err != nil || r.Status != "ok" {
				b.Fatalf("starting the child: %v %+v", err, r)
			}
			var text string
			_ = json.Unmarshal(r.UserExpressions["pid"].Data["text/plain"], &text)
			child, err := strconv.Atoi(text)
			if err != nil {
				b.Fatalf("child pid: %v %+v", err, r.UserExpressions)
			}
			reap.Add(child)
			if kind == "ignore" {
				testenv.Poll(b, 10*time.Second, "the child to ignore SIGTERM", func() bool { return sigtermIgnored(child) })
			}
			gpu.SetGPUs(b, []map[int]uint64{map[int]uint64{kernel: 600 << 20, child: 3 << 30}})
			testenv.Poll(b, 15*time.Second, "the daemon attributes the child to the kernel", func() bool {
				for _, p := range d.notebookPIDs(b)[sess.Kernel.ID] {
					if p == child {
						return true
					}
				}
				return false
			})

			// The daemon polls /proc once per --interval: restart at a random
			// phase of its tick, as users do (right after the attribution
			// above we would always be just past one).
			time.Sleep(rand.N(time.Second))
			from := d.LogCount()
			oldSession := c.LastKernelInfo().Session
			start := time.Now()
			type probe struct {
				ready time.Time
				err   error
			}
			probed := make(chan probe, 1)
			go func() {
				pc, ready, err := dialNewKernel(cf, oldSession, time.Minute)
				if err == nil {
					_ = pc.Close()
				}
				probed <- probe{ready, err}
			}()
			restarted := make(chan time.Time, 1)
			go func() {
				resp, err := srv.Do(http.MethodPost, "api/kernels/"+sess.Kernel.ID+"/restart", nil)
				if err == nil {
					resp.Body.Close()
				}
				restarted <- time.Now()
			}()
			testenv.Poll(b, 20*time.Second, "the orphan "+strconv.Itoa(child)+" to end", func() bool { return !testenv.Alive(child) })
			ended := time.Since(start)
			restartReturned := (<-restarted).Sub(start)
			// "after" should say restart; a live kernel taken for shut down
			// (see false-shutdowns) may say shutdown.
			term := d.WaitLogSince(b, 10*time.Second, from, "ending orphan that holds GPU memory (SIGTERM)",
				map[string]any{"pid": child})
			// The daemon logs the injection when the new process has
			// answered it: %gpumem is there from that moment.
			injected := d.WaitLogSince(b, 60*time.Second, from, "magics injected", map[string]any{"kernel_id": sess.Kernel.ID})
			p := <-probed
			if p.err != nil {
				b.Fatal(p.err)
			}
			falseShutdowns += d.countLogs(from, "kernel shut down (connection file removed)", sess.Kernel.ID)
			old := kernel
			kernel = testenv.KernelPID(b, cf, old)
			reap.Add(kernel)
			gpu.SetGPUs(b, []map[int]uint64{nil})
			waitMagic(b, c, 60*time.Second) // and our frontend sees it
			gone[kind] = append(gone[kind], ended)
			toSIGTERM[kind] = append(toSIGTERM[kind], term.At.Sub(start))
			magicBack = append(magicBack, injected.At.Sub(start))
			newReady = append(newReady, p.ready.Sub(start))
			readyToInjected = append(readyToInjected, injected.At.Sub(p.ready))
			details = append(details, fmt.Sprintf("%-6s child: gone %5.0f ms after the restart request (SIGTERM at %4.0f ms); restart request returned at %4.0f ms; "+
				"new kernel answered at %4.0f ms, %%gpumem injected in it at %5.0f ms; logged after=%v", kind, ms(ended), ms(term.At.Sub(start)),
				ms(restartReturned), ms(p.ready.Sub(start)), ms(injected.At.Sub(start)), term.Fields["after"]))
		}
	}
	b.StopTimer()
	b.Logf("load average %.2f → %.2f; -v shows every sample", load0, testenv.LoadAverage())
	for _, l := range details {
		b.Log(l)
	}
	b.ReportMetric(0, "ns/op")
	report(b, "term-child-gone", gone["term"], true)
	report(b, "ignoring-child-gone", gone["ignore"], true)
	report(b, "restart-to-sigterm", append(toSIGTERM["term"], toSIGTERM["ignore"]...), true)
	report(b, "restart-to-new-kernel-ready", newReady, false)
	report(b, "restart-to-magic", magicBack, true)
	report(b, "new-kernel-ready-to-magic", readyToInjected, true)
	b.ReportMetric(float64(falseShutdowns), "false-shutdowns")
}
