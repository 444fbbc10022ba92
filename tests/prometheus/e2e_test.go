package prometheus

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpumem/gpumem/internal/testenv"
)

const gib = 1 << 30

// The label budget documented in docs/prometheus.md: series gpumem exports
// on every host, and for each GPU. Per notebook: one series per GPU it holds
// memory on; per user: the same. The Go and process collectors add a fixed
// number more, measured here.
const (
	// threshold, attached, sample duration/success/timestamp, simulated,
	// reclaimed bytes/processes, left running (computing, unknown); each of
	// the sample's 9 steps' duration and success
	seriesPerHost = 10 + 2*9
	seriesPerGPU  = 6 // total, used, other, alert, SM and memory utilization
	// An idle kernel holding GPU memory: its bytes and idle seconds (with
	// notebook labels only).
	seriesPerIdleNotebook = 2
	// Per notebook and GPU: its bytes, its SM and memory utilization; per
	// notebook: whether it computes, what it hoarded; per notebook
	// process and GPU: its SM utilization (notebook labels only). Per
	// user: what their notebooks hoarded.
	seriesPerNotebookGPU = 3
	seriesPerNotebook    = 2
	seriesPerProcessGPU  = 1
	seriesPerUser        = 1
)

// startServe runs `gpumem serve --listen` on srv's runtime dir and waits
// until its /metrics lists every kernel in kernelIDs (in the
// notebook or, without notebook labels, until a user series shows).
func startServe(t *testing.T, srv *testenv.Server, gpuFile string, args ...string) (*testenv.Proc, string) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	argv := append([]string{gpumemBin, "serve", "--listen=" + addr, "--log-format=json", "--interval=500ms"}, args...)
	p := testenv.Start(t, testenv.Env(srv.Dir, "GPUMEM_FAKE_GPU="+gpuFile), srv.Dir, argv...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gpumem serve %v output:\n%s", args, p.Output())
		}
	})
	return p, addr
}

// waitMetrics polls addr's /metrics until it contains every string in want.
func waitMetrics(t *testing.T, p *testenv.Proc, addr string, want ...string) string {
	t.Helper()
	var text string
	testenv.Poll(t, 30*time.Second, "gpumem /metrics on "+addr+" listing "+strings.Join(want, ", "), func() bool {
		if p.Exited() {
			t.Fatalf("gpumem serve exited:\n%s", p.Output())
		}
		var err error
		if text, err = scrapeText(t, addr); err != nil {
			return false
		}
		for _, w := range want {
			if !strings.Contains(text, w) {
				return false
			}
		}
		return true
	})
	return text
}

// countSeries parses a /metrics page: series per family.
func countSeries(t *testing.T, text string) map[string]int {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]int{}
	for name, f := range fams {
		n := len(f.GetMetric())
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			n = 0
			for _, m := range f.GetMetric() {
				n += len(m.GetHistogram().GetBucket()) + 3 // +Inf, _sum, _count
			}
		case dto.MetricType_SUMMARY:
			n = 0
			for _, m := range f.GetMetric() {
				n += len(m.GetSummary().GetQuantile()) + 2
			}
		}
		out[name] = n
	}
	return out
}

func sumSeries(counts map[string]int, prefix string) int {
	n := 0
	for name, c := range counts {
		if strings.HasPrefix(name, prefix) {
			n += c
		}
	}
	return n
}

func approx(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// TestPrometheusEndToEnd: two "hosts", each a real Notebook server with two
// real kernels on two simulated GPUs and its own daemon. The first exports
// per-notebook series and has an orphan to reclaim; the second exports
// per-user ones only (--metrics-notebook-label=false). A real Prometheus
// scrapes both, evaluates the shipped rules and answers the dashboard's
// queries.
func TestPrometheusEndToEnd(t *testing.T) {
	requireTool(t, "prometheus")
	promtool := requireTool(t, "promtool")
	testenv.Require(t, "notebook", "ipykernel", "jupyter_client")
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}

	srv := testenv.StartServer(t, testenv.NotebookServer())
	sessA := srv.CreateSession(t, "team/a.ipynb")
	sessB := srv.CreateSession(t, "b.ipynb")
	cfA, cfB := srv.ConnectionFile(sessA.Kernel.ID), srv.ConnectionFile(sessB.Kernel.ID)
	pidA, pidB := testenv.KernelPID(t, cfA), testenv.KernelPID(t, cfB)
	nbA, nbB := filepath.Join(srv.RootDir, "team", "a.ipynb"), filepath.Join(srv.RootDir, "b.ipynb")

	// A child of kernel A in its own session: kernel A's restart misses it.
	r := testenv.RunCell(t, cfA, "import subprocess, sys\n"+
		"_w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"+
		"print(_w.pid)", 60*time.Second)
	orphan, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if err != nil {
		t.Fatalf("orphan pid: cell printed %q (%s %s)", r.Stdout, r.EName, r.EValue)
	}
	testenv.NewReaper(t, nil).Add(orphan) // a pidfd: once reclaimed, its number may be another's
	unrelated := testenv.Start(t, testenv.Env(srv.Dir), srv.Dir, "/bin/sleep", "600")

	// GPU 0: A 60 GiB + its orphan 6 GiB, B 4 GiB: 70 of 80 GiB (87.5%).
	// GPU 1: B 2 GiB and a process of no kernel 1 GiB.
	gpuFile := filepath.Join(t.TempDir(), "gpus.json")
	gpus := []testenv.SimGPU{
		{Name: "Simulated H200", UUID: "GPU-sim-0", MemoryTotalBytes: 80 * gib, Processes: []testenv.FakeProc{
			{PID: pidA, UsedBytes: 60 * gib}, {PID: orphan, UsedBytes: 6 * gib}, {PID: pidB, UsedBytes: 4 * gib}}},
		{Name: "Simulated H200", UUID: "GPU-sim-1", MemoryTotalBytes: 80 * gib, Processes: []testenv.FakeProc{
			{PID: pidB, UsedBytes: 2 * gib}, {PID: unrelated.Cmd.Process.Pid, UsedBytes: 1 * gib}}},
	}
	testenv.WriteSimulatedGPUs(t, gpuFile, gpus...)

	full, fullAddr := startServe(t, srv, gpuFile, "--reclaim-grace=1s")
	// Both kernels sit idle holding memory: once their servers say so, the
	// idle series are there too, and once the daemon has judged their GPU
	// work (three readings), their verdict and hoarding; then the page
	// stays as it is.
	fullText := waitMetrics(t, full, fullAddr, sessA.Kernel.ID, sessB.Kernel.ID,
		fmt.Sprintf(`gpumem_notebook_gpu_memory_bytes{gpu="0",kernel_id=%q,notebook=%q,user=%q} 7.0866960384e+10`, sessA.Kernel.ID, nbA, me.Username),
		fmt.Sprintf(`gpumem_idle_gpu_memory_bytes{kernel_id=%q`, sessA.Kernel.ID),
		fmt.Sprintf(`gpumem_idle_gpu_memory_bytes{kernel_id=%q`, sessB.Kernel.ID),
		fmt.Sprintf(`gpumem_notebook_gpu_computing{kernel_id=%q,notebook=%q,user=%q} 0`, sessA.Kernel.ID, nbA, me.Username),
		fmt.Sprintf(`gpumem_notebook_gpu_computing{kernel_id=%q,notebook=%q,user=%q} 0`, sessB.Kernel.ID, nbB, me.Username),
		fmt.Sprintf(`gpumem_notebook_hoarded_gpu_memory_byte_seconds{kernel_id=%q`, sessA.Kernel.ID),
		fmt.Sprintf(`gpumem_notebook_hoarded_gpu_memory_byte_seconds{kernel_id=%q`, sessB.Kernel.ID))
	// The second "host": one daemon per runtime dir, so its own server, with
	// the same layout (C in place of A and its orphan, D of B).
	srv2 := testenv.StartServer(t, testenv.NotebookServer())
	pidC := testenv.KernelPID(t, srv2.ConnectionFile(srv2.CreateSession(t, "c.ipynb").Kernel.ID))
	pidD := testenv.KernelPID(t, srv2.ConnectionFile(srv2.CreateSession(t, "d.ipynb").Kernel.ID))
	unrelated2 := testenv.Start(t, testenv.Env(srv2.Dir), srv2.Dir, "/bin/sleep", "600")
	gpuFile2 := filepath.Join(t.TempDir(), "gpus.json")
	testenv.WriteSimulatedGPUs(t, gpuFile2,
		testenv.SimGPU{Name: "Simulated H200", UUID: "GPU-sim-0", MemoryTotalBytes: 80 * gib, Processes: []testenv.FakeProc{{PID: pidC, UsedBytes: 66 * gib}, {PID: pidD, UsedBytes: 4 * gib}}},
		testenv.SimGPU{Name: "Simulated H200", UUID: "GPU-sim-1", MemoryTotalBytes: 80 * gib, Processes: []testenv.FakeProc{{PID: pidD, UsedBytes: 2 * gib}, {PID: unrelated2.Cmd.Process.Pid, UsedBytes: 1 * gib}}},
	)
	lean, leanAddr := startServe(t, srv2, gpuFile2, "--metrics-notebook-label=false")
	leanText := waitMetrics(t, lean, leanAddr, fmt.Sprintf(`gpumem_user_gpu_memory_bytes{gpu="0",user=%q} 7.516192768e+10`, me.Username),
		fmt.Sprintf(`gpumem_user_hoarded_gpu_memory_byte_seconds{user=%q}`, me.Username))

	t.Run("promtool check metrics", func(t *testing.T) {
		for _, text := range []string{fullText, leanText} {
			cmd := exec.Command(promtool, "check", "metrics")
			cmd.Stdin = strings.NewReader(text)
			out, err := cmd.CombinedOutput()
			if err != nil || len(strings.TrimSpace(string(out))) > 0 {
				t.Errorf("promtool check metrics: %v\n%s", err, out)
			}
		}
	})

	// Cardinality of the real /metrics against the documented budget:
	// notebook A holds memory on 1 GPU, B on 2; one user on 2 GPUs.
	fullCounts, leanCounts := countSeries(t, fullText), countSeries(t, leanText)
	// Both notebooks have held memory: each has a peak series. Their
	// processes on GPUs: A's kernel and its orphan on GPU 0, B's kernel on
	// both.
	notebookGPUs, userGPUs, idleNotebooks, peakNotebooks, notebooks, processGPUs, users := 3, 2, 2, 2, 2, 4, 1
	t.Run("label budget", func(t *testing.T) {
		wantFull := seriesPerHost + seriesPerGPU*len(gpus) + seriesPerNotebookGPU*notebookGPUs + userGPUs +
			seriesPerIdleNotebook*idleNotebooks + peakNotebooks + seriesPerNotebook*notebooks + seriesPerProcessGPU*processGPUs +
			seriesPerUser*users
		wantLean := seriesPerHost + seriesPerGPU*len(gpus) + userGPUs + seriesPerUser*users
		if got := sumSeries(fullCounts, "gpumem_"); got != wantFull {
			t.Errorf("/metrics with notebook labels: %d gpumem_ series, budget says %d: %v", got, wantFull, fullCounts)
		}
		if got := sumSeries(leanCounts, "gpumem_"); got != wantLean {
			t.Errorf("/metrics with --metrics-notebook-label=false: %d gpumem_ series, budget says %d: %v", got, wantLean, leanCounts)
		}
		if n := fullCounts["gpumem_notebook_gpu_memory_bytes"]; n != notebookGPUs {
			t.Errorf("%d per-notebook series, want %d", n, notebookGPUs)
		}
		if strings.Contains(leanText, "notebook=") || strings.Contains(leanText, "kernel_id=") || strings.Contains(leanText, ".ipynb") {
			t.Errorf("--metrics-notebook-label=false still exports notebook labels:\n%s", leanText)
		}
		t.Logf("/metrics series: notebook labels: %d gpumem_ + %d go_ + %d process_ + %d promhttp_ = %d; without: %d gpumem_, %d in all",
			sumSeries(fullCounts, "gpumem_"), sumSeries(fullCounts, "go_"), sumSeries(fullCounts, "process_"),
			sumSeries(fullCounts, "promhttp_"), sumSeries(fullCounts, ""), sumSeries(leanCounts, "gpumem_"), sumSeries(leanCounts, ""))
	})

	prom := startPrometheus(t, fullAddr, leanAddr)
	sel := func(addr, rest string) string {
		if rest != "" {
			rest = "," + rest
		}
		return fmt.Sprintf(`{job="gpumem",instance=%q%s}`, addr, rest)
	}

	t.Run("series", func(t *testing.T) {
		prom.waitQuery(t, `up{job="gpumem"} == 1`, "both daemons up", func(v model.Vector) bool { return len(v) == 2 })
		v := prom.waitQuery(t, "gpumem_notebook_gpu_memory_bytes"+sel(fullAddr, ""), "three per-notebook series",
			func(v model.Vector) bool { return len(v) == notebookGPUs })
		want := map[string]float64{
			sessA.Kernel.ID + "/0": 66 * gib, sessB.Kernel.ID + "/0": 4 * gib, sessB.Kernel.ID + "/1": 2 * gib}
		for _, s := range v {
			k := string(s.Metric["kernel_id"]) + "/" + string(s.Metric["gpu"])
			nb := map[string]string{sessA.Kernel.ID: nbA, sessB.Kernel.ID: nbB}[string(s.Metric["kernel_id"])]
			if float64(s.Value) != want[k] || string(s.Metric["notebook"]) != nb || string(s.Metric["user"]) != me.Username {
				t.Errorf("series %v = %v; want %v bytes, notebook %s, user %s", s.Metric, s.Value, want[k], nb, me.Username)
			}
		}
		if v := prom.query(t, "gpumem_notebook_gpu_memory_bytes"+sel(leanAddr, "")); len(v) != 0 {
			t.Errorf("the daemon without notebook labels exported %v", v)
		}
		if v := prom.query(t, `count by (instance) ({job="gpumem",notebook!=""})`); len(v) != 1 || string(v[0].Metric["instance"]) != fullAddr {
			t.Errorf("notebook-labelled series by instance: %v, want only %s", v, fullAddr)
		}
		for _, addr := range []string{fullAddr, leanAddr} {
			// Recording rules: their first evaluation may trail the scrape.
			v := prom.waitQuery(t, `gpumem:user_gpu_memory_bytes:sum`+sel(addr, ""), "recorded per-user sum",
				func(v model.Vector) bool { return len(v) > 0 })
			if len(v) != 1 || float64(v[0].Value) != 72*gib || string(v[0].Metric["user"]) != me.Username {
				t.Errorf("%s: per-user sum %v, want %s 72 GiB", addr, v, me.Username)
			}
			v = prom.waitQuery(t, `gpumem:gpu_memory_used:ratio`+sel(addr, `gpu="0"`), "recorded used ratio",
				func(v model.Vector) bool { return len(v) > 0 })
			if len(v) != 1 || !approx(float64(v[0].Value), 70.0/80) {
				t.Errorf("%s: GPU 0 used ratio %v, want 0.875", addr, v)
			}
			v = prom.query(t, `gpumem_other_gpu_memory_bytes`+sel(addr, `gpu="1"`))
			if len(v) != 1 || float64(v[0].Value) != 1*gib {
				t.Errorf("%s: GPU 1 other %v, want 1 GiB", addr, v)
			}
		}
	})

	t.Run("series in Prometheus", func(t *testing.T) {
		// Prometheus stores what /metrics shows, one series each, plus its
		// own per-target series (up, scrape_*).
		for _, tc := range []struct {
			addr   string
			counts map[string]int
		}{{fullAddr, fullCounts}, {leanAddr, leanCounts}} {
			v := prom.waitQuery(t, fmt.Sprintf(`count({__name__=~"gpumem_.+",instance=%q})`, tc.addr), "gpumem series of "+tc.addr,
				func(v model.Vector) bool { return len(v) == 1 && int(v[0].Value) == sumSeries(tc.counts, "gpumem_") })
			// Recorded series and ALERTS carry job and instance too: count
			// them apart.
			all := prom.query(t, fmt.Sprintf(`count({job="gpumem",instance=%q,__name__!~".+:.+|ALERTS|ALERTS_FOR_STATE"})`, tc.addr))
			recorded := prom.query(t, fmt.Sprintf(`count({instance=%q,__name__=~".+:.+"})`, tc.addr))
			scraped := prom.query(t, fmt.Sprintf(`scrape_samples_scraped{instance=%q}`, tc.addr))
			if len(all) != 1 || len(scraped) != 1 || len(recorded) != 1 {
				t.Fatalf("count %v, scrape_samples_scraped %v, recorded %v", all, scraped, recorded)
			}
			t.Logf("Prometheus holds %d gpumem_ series and %d in all for %s (last scrape: %d samples), and %d recorded by the rules",
				int(v[0].Value), int(all[0].Value), tc.addr, int(scraped[0].Value), int(recorded[0].Value))
			if int(scraped[0].Value) != sumSeries(tc.counts, "") {
				t.Errorf("%s: Prometheus scraped %d samples, /metrics had %d series", tc.addr, int(scraped[0].Value), sumSeries(tc.counts, ""))
			}
			// up, scrape_duration_seconds, scrape_samples_scraped,
			// scrape_samples_post_metric_relabeling, scrape_series_added.
			const perTarget = 5
			if int(all[0].Value) != int(scraped[0].Value)+perTarget {
				t.Errorf("%s: Prometheus holds %d series, want the %d scraped + %d of its own", tc.addr, int(all[0].Value), int(scraped[0].Value), perTarget)
			}
		}
	})

	t.Run("GPU alert names the top notebooks", func(t *testing.T) {
		var alerts []alertView
		testenv.Poll(t, 30*time.Second, "GPUMemoryHigh pending on both hosts", func() bool {
			alerts = activeAlerts(t, prom, "GPUMemoryHigh")
			return len(alerts) == 2
		})
		for _, a := range alerts {
			if a.labels["gpu"] != "0" || a.state != "pending" {
				t.Errorf("alert %v in state %s, want GPU 0 pending (for: 5m)", a.labels, a.state)
			}
			var want string
			switch a.labels["instance"] {
			case fullAddr:
				want = fmt.Sprintf("Top notebooks: %s (%s, kernel %s) 66GiB; %s (%s, kernel %s) 4GiB;",
					nbA, me.Username, sessA.Kernel.ID, nbB, me.Username, sessB.Kernel.ID)
			case leanAddr:
				want = fmt.Sprintf("Top users: %s 70GiB;", me.Username)
			}
			if a.annotations["description"] != want {
				t.Errorf("%s: description %q, want %q", a.labels["instance"], a.annotations["description"], want)
			}
			if want := "GPU 0 (Simulated H200) on " + a.labels["instance"] + " is 87.5% full"; a.annotations["summary"] != want {
				t.Errorf("summary %q, want %q", a.annotations["summary"], want)
			}
		}
	})

	// Restarting kernel A leaves its orphan; the first host's daemon ends it
	// and counts it; the other host's counts nothing.
	srv.JSON(t, http.MethodPost, "api/kernels/"+sessA.Kernel.ID+"/restart", nil, nil)
	testenv.Poll(t, 10*time.Second, "orphan "+strconv.Itoa(orphan)+" ended", func() bool { return !testenv.Alive(orphan) })
	if !testenv.Alive(unrelated.Cmd.Process.Pid) {
		t.Fatalf("the process of no kernel was ended")
	}
	gpus[0].Processes = []testenv.FakeProc{{PID: pidB, UsedBytes: 4 * gib}} // the old kernel A process and its orphan are gone
	testenv.WriteSimulatedGPUs(t, gpuFile, gpus...)

	t.Run("reclaims", func(t *testing.T) {
		prom.waitQuery(t, "gpumem_reclaimed_bytes_total"+sel(fullAddr, ""), "6 GiB reclaimed",
			func(v model.Vector) bool { return len(v) == 1 && float64(v[0].Value) == 6*gib })
		if v := prom.query(t, "gpumem_reclaimed_processes_total"+sel(fullAddr, "")); len(v) != 1 || v[0].Value != 1 {
			t.Errorf("reclaimed processes %v, want 1", v)
		}
		if v := prom.query(t, "gpumem_reclaimed_bytes_total"+sel(leanAddr, "")); len(v) != 1 || v[0].Value != 0 {
			t.Errorf("the other host's daemon counted %v", v)
		}
		var alerts []alertView
		testenv.Poll(t, 30*time.Second, "GPUMemoryOrphansReclaimed firing", func() bool {
			alerts = activeAlerts(t, prom, "GPUMemoryOrphansReclaimed")
			return len(alerts) == 1 && alerts[0].state == "firing"
		})
		if alerts[0].labels["instance"] != fullAddr ||
			!strings.HasPrefix(alerts[0].annotations["description"], "1 orphaned process(es) in the last 15 minutes, holding 6GiB of GPU memory.") {
			t.Errorf("alert %v %v", alerts[0].labels, alerts[0].annotations)
		}
		t.Logf("reclaim alert: %s", alerts[0].annotations["description"])
	})

	t.Run("grafana dashboard", func(t *testing.T) {
		checkDashboard(t, prom, repoPath(t, "deploy/grafana/gpumem.json"))
	})

	t.Run("no alert about sampling", func(t *testing.T) {
		for _, name := range []string{"GPUMemSamplingFailing", "GPUMemSamplesStale", "GPUMemExporterDown"} {
			if a := activeAlerts(t, prom, name); len(a) != 0 {
				t.Errorf("%s active: %v", name, a)
			}
		}
	})
}

type alertView struct {
	labels, annotations map[string]string
	state               string
}

// activeAlerts lists Prometheus's pending and firing alerts named name,
// sorted by instance.
func activeAlerts(t testing.TB, prom *server, name string) []alertView {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := prom.api.Alerts(ctx)
	if err != nil {
		t.Fatalf("alerts: %v", err)
	}
	var out []alertView
	for _, a := range res.Alerts {
		if string(a.Labels["alertname"]) != name {
			continue
		}
		v := alertView{labels: map[string]string{}, annotations: map[string]string{}, state: string(a.State)}
		for k, x := range a.Labels {
			v.labels[string(k)] = string(x)
		}
		for k, x := range a.Annotations {
			v.annotations[string(k)] = string(x)
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].labels["instance"] < out[j].labels["instance"] })
	return out
}
