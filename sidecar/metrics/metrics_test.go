package metrics

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

var update = flag.Bool("update", false, "rewrite testdata/metrics.golden")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeSource is a Source whose snapshot a test swaps.
type fakeSource struct {
	mu   sync.Mutex
	snap Snapshot
}

func (s *fakeSource) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

func (s *fakeSource) set(snap Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snap = snap
}

const gib = 1 << 30

func util(sm, mem uint32) *attribution.Utilization {
	return &attribution.Utilization{SMPercent: sm, MemoryPercent: mem}
}

func hours(h float64) *float64 { return &h }

func testSnapshot() Snapshot {
	snap := Snapshot{
		Report: attribution.Report{
			GPUs: []attribution.GPU{
				{Index: 0, UUID: "GPU-aaaa", Name: "NVIDIA H200", MemoryTotalBytes: 100 * gib, MemoryUsedBytes: 85 * gib, Simulated: true, NotebookBytes: 80 * gib, OtherBytes: 5 * gib, FreeBytes: 15 * gib,
					Utilization: util(87, 6)},
				{Index: 1, UUID: "GPU-bbbb", Name: "NVIDIA H200", MemoryTotalBytes: 100 * gib, MemoryUsedBytes: 10 * gib, Simulated: true, NotebookBytes: 10 * gib, FreeBytes: 90 * gib,
					UtilizationMissing: "MIG"},
			},
			Notebooks: []attribution.Notebook{
				{KernelID: "kernel-a", Notebook: "/home/alice/a.ipynb", PIDs: []int{101, 102}, User: "alice", GPUMemoryBytes: 70 * gib,
					PerGPU:      []attribution.GPUBytes{{Index: 0, Bytes: 70 * gib, Utilization: util(87, 6)}},
					Utilization: util(87, 6),
					Processes: []attribution.ProcessBytes{
						{PID: 101, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 60 * gib, Utilization: util(80, 5)}}},
						{PID: 102, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 10 * gib, Utilization: util(7, 1)}}},
					},
					ConnectionFile: "/run/jupyter/kernel-a.json"},
				{KernelID: "kernel-b", Notebook: "/home/bob/b.ipynb", PIDs: []int{201}, User: "bob", GPUMemoryBytes: 20 * gib,
					PerGPU:         []attribution.GPUBytes{{Index: 0, Bytes: 10 * gib, Utilization: util(0, 0)}, {Index: 1, Bytes: 10 * gib}},
					ConnectionFile: "/run/jupyter/kernel-b.json"},
				{KernelID: "kernel-c", Notebook: "", PIDs: []int{301}, User: "alice", ConnectionFile: "/run/jupyter/kernel-c.json"},
			},
			Other: []attribution.OtherProcess{{PID: 401, User: "bob", Command: "python train.py", PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 5 * gib}}}},
		},
		AttachedKernels: 3,
		SampleDuration:  12500 * time.Microsecond,
		SampleSuccess:   true,
		SampledAt:       time.Unix(1767225600, 500_000_000),
		AlertThreshold:  0.8,
		Steps: []StepTiming{{Step: "observe", Duration: 9 * time.Millisecond, Success: true},
			{Step: "alerts", Duration: 500 * time.Microsecond, Success: false}},
	}
	// The daemon finishes each report before metrics reads it: the alert
	// gauge reads the report's threshold alerts, the compute series the
	// verdicts and hoarding the daemon judged.
	attribution.Finish(&snap.Report, attribution.FinishInput{Alerts: attribution.AlertConfig{Threshold: snap.AlertThreshold},
		Compute: &attribution.ComputeFacts{Kernels: map[string]attribution.Compute{
			"/run/jupyter/kernel-a.json": {State: attribution.ComputeComputing, HoardedGiBHours: hours(0)},
			"/run/jupyter/kernel-b.json": {State: attribution.ComputeIdle, HoardedGiBHours: hours(2.5)},
			"/run/jupyter/kernel-c.json": {State: attribution.ComputeUnknown},
		}, Hoarding: []attribution.UserHoarding{{User: "bob", GiBHours: 2.5, WindowSeconds: 86400}, {User: "alice", GiBHours: 0, WindowSeconds: 86400}}}})
	return snap
}

// serve starts Listen+Serve for m on 127.0.0.1:0; Cleanup stops it and
// checks that Serve returned.
func serve(t *testing.T, h http.Handler, addr string, allowNonLoopback bool) *Server {
	t.Helper()
	srv, err := Listen(t.Context(), addr, allowNonLoopback, h, zerolog.New(io.Discard))
	if err != nil {
		t.Fatalf("Listen(%s): %v", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("Serve did not return within 15s of cancel")
		}
	})
	return srv
}

type reply struct {
	status int
	header http.Header
	body   string
}

// get sends one request with a chosen Host over a fresh connection.
func get(t *testing.T, srv *Server, method, path, host string) reply {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+srv.Addr().String()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(body)}
}

// scrape GETs /metrics and parses it as Prometheus text.
func scrape(t *testing.T, srv *Server) map[string]*dto.MetricFamily {
	t.Helper()
	r := get(t, srv, "GET", "/metrics", "")
	if r.status != 200 {
		t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(r.body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, r.body)
	}
	return fams
}

// ours renders our families (not go_, process_ or promhttp_) in name order.
func ours(t *testing.T, fams map[string]*dto.MetricFamily) string {
	t.Helper()
	var names []string
	for name := range fams {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") || strings.HasPrefix(name, "promhttp_") {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	for _, name := range names {
		if _, err := expfmt.MetricFamilyToText(&buf, fams[name]); err != nil {
			t.Fatal(err)
		}
	}
	return buf.String()
}

func TestMetricsGolden(t *testing.T) {
	src := &fakeSource{snap: testSnapshot()}
	m := New(src, zerolog.New(io.Discard))
	m.AddReclaimed(2, 3*gib)
	m.AddReclaimed(1, 512<<20)
	srv := serve(t, m.Handler(), "127.0.0.1:0", false)

	fams := scrape(t, srv)
	for _, want := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if fams[want] == nil {
			t.Errorf("/metrics lacks %s: Go and process collectors not registered", want)
		}
	}
	got := ours(t, fams)
	golden := filepath.Join("testdata", "metrics.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("/metrics differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", golden, got, want)
	}
}

// Prometheus's own linter finds nothing wrong with our names, units and help.
func TestMetricsLint(t *testing.T) {
	m := New(&fakeSource{snap: testSnapshot()}, zerolog.New(io.Discard))
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "gpumem_") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

// The series of a kernel or GPU gone from the snapshot are gone from the
// next scrape.
func TestVanishedSeries(t *testing.T) {
	src := &fakeSource{snap: testSnapshot()}
	srv := serve(t, New(src, zerolog.New(io.Discard)).Handler(), "127.0.0.1:0", false)

	series := func() map[string]bool {
		out := map[string]bool{}
		for name, f := range scrape(t, srv) {
			if !strings.HasPrefix(name, "gpumem_") {
				continue
			}
			for _, mt := range f.GetMetric() {
				var labels []string
				for _, l := range mt.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				out[name+"{"+strings.Join(labels, ",")+"}"] = true
			}
		}
		return out
	}
	const (
		bOnGPU1 = "gpumem_notebook_gpu_memory_bytes{gpu=1,kernel_id=kernel-b,notebook=/home/bob/b.ipynb,user=bob}"
		gpu1    = "gpumem_gpu_memory_used_bytes{gpu=1,name=NVIDIA H200,uuid=GPU-bbbb}"
		aOnGPU0 = "gpumem_notebook_gpu_memory_bytes{gpu=0,kernel_id=kernel-a,notebook=/home/alice/a.ipynb,user=alice}"
	)
	before := series()
	for _, s := range []string{bOnGPU1, gpu1, aOnGPU0} {
		if !before[s] {
			t.Fatalf("first scrape lacks %s; has %v", s, before)
		}
	}

	snap := testSnapshot()
	snap.Report.Notebooks = snap.Report.Notebooks[:1] // kernel-b and kernel-c gone
	snap.Report.GPUs = snap.Report.GPUs[:1]           // GPU 1 gone
	src.set(snap)
	after := series()
	for s := range after {
		if strings.Contains(s, "kernel-b") || strings.Contains(s, "gpu=1") {
			t.Errorf("stale series after the kernel and GPU vanished: %s", s)
		}
	}
	if !after[aOnGPU0] {
		t.Errorf("kernel-a's series lost")
	}
}

// Duplicate entries in a report are summed or skipped: the scrape never fails.
func TestDuplicateEntries(t *testing.T) {
	snap := testSnapshot()
	snap.Report.GPUs = append(snap.Report.GPUs, snap.Report.GPUs[0])
	snap.Report.Notebooks[0].PerGPU = append(snap.Report.Notebooks[0].PerGPU, attribution.GPUBytes{Index: 0, Bytes: 1 * gib})
	m := New(&fakeSource{snap: snap}, zerolog.New(io.Discard))
	if _, err := m.Registry().Gather(); err != nil {
		t.Fatalf("Gather with duplicates: %v", err)
	}
	expected := `# HELP gpumem_notebook_gpu_memory_bytes GPU memory held by the processes of a notebook's kernel, in bytes.
# TYPE gpumem_notebook_gpu_memory_bytes gauge
gpumem_notebook_gpu_memory_bytes{gpu="0",kernel_id="kernel-a",notebook="/home/alice/a.ipynb",user="alice"} 7.6235669504e+10
gpumem_notebook_gpu_memory_bytes{gpu="0",kernel_id="kernel-b",notebook="/home/bob/b.ipynb",user="bob"} 1.073741824e+10
gpumem_notebook_gpu_memory_bytes{gpu="1",kernel_id="kernel-b",notebook="/home/bob/b.ipynb",user="bob"} 1.073741824e+10
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(expected), "gpumem_notebook_gpu_memory_bytes"); err != nil {
		t.Error(err)
	}
}

// Before the first sample: no GPU series, success 0, no timestamp.
func TestEmptySnapshot(t *testing.T) {
	m := New(&fakeSource{}, zerolog.New(io.Discard))
	expected := `# HELP gpumem_sample_success 1 when the last sample of GPU memory succeeded, else 0.
# TYPE gpumem_sample_success gauge
gpumem_sample_success 0
# HELP gpumem_attached_kernels Number of Jupyter kernels the daemon is attached to.
# TYPE gpumem_attached_kernels gauge
gpumem_attached_kernels 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(expected),
		"gpumem_sample_success", "gpumem_attached_kernels", "gpumem_gpu_memory_used_bytes", "gpumem_last_sample_timestamp_seconds"); err != nil {
		t.Error(err)
	}
}

func TestHostRejected(t *testing.T) {
	m := New(&fakeSource{snap: testSnapshot()}, zerolog.New(io.Discard))
	srv := serve(t, m.Handler(), "127.0.0.1:0", false)
	_, port, err := net.SplitHostPort(srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host string
		want int
	}{
		{"127.0.0.1:" + port, 200},
		{"127.0.0.1", 200},
		{"localhost:" + port, 200},
		{"LOCALHOST:9400", 200},
		{"localhost", 200},
		{"[::1]:" + port, 200},
		{"[::1]", 200},
		{"127.0.0.2:80", 200},
		{"evil.example", 403},
		{"evil.example:" + port, 403},
		{"localhost.evil.example", 403},
		{"127.0.0.1.nip.io:" + port, 403},
		{"10.0.0.5:" + port, 403},
		{"[::2]:" + port, 403},
		{"0.0.0.0:" + port, 403},
	} {
		r := get(t, srv, "GET", "/metrics", tc.host)
		if r.status != tc.want {
			t.Errorf("Host %q: %d, want %d", tc.host, r.status, tc.want)
		}
		if tc.want == 403 && strings.Contains(r.body, "gpumem_") {
			t.Errorf("Host %q: refused but leaked metrics", tc.host)
		}
	}
}

func TestMethodsAndPaths(t *testing.T) {
	m := New(&fakeSource{snap: testSnapshot()}, zerolog.New(io.Discard))
	srv := serve(t, m.Handler(), "127.0.0.1:0", false)
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/metrics", 200},
		{"HEAD", "/metrics", 200},
		{"POST", "/metrics", 405},
		{"DELETE", "/metrics", 405},
		{"GET", "/", 404},
		{"GET", "/debug/pprof/", 404},
	} {
		if r := get(t, srv, tc.method, tc.path, ""); r.status != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, r.status, tc.want)
		}
	}
}

func TestListenRefusesNonLoopback(t *testing.T) {
	h := http.NotFoundHandler()
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "10.1.2.3:9400", "example.com:9400", "localhost.example.com:0"} {
		srv, err := Listen(t.Context(), addr, false, h, zerolog.New(io.Discard))
		if !errors.Is(err, ErrNonLoopback) {
			if srv != nil {
				_ = srv.Close()
			}
			t.Errorf("Listen(%q, allowNonLoopback=false) = %v, want ErrNonLoopback", addr, err)
		}
	}
	if _, err := Listen(t.Context(), "127.0.0.1", false, h, zerolog.New(io.Discard)); err == nil {
		t.Error("Listen without a port: no error")
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0"} {
		srv, err := Listen(t.Context(), addr, false, h, zerolog.New(io.Discard))
		if err != nil {
			t.Errorf("Listen(%q): %v", addr, err)
			continue
		}
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if ln, err := net.Listen("tcp", "[::1]:0"); err == nil {
		_ = ln.Close()
		srv, err := Listen(t.Context(), "[::1]:0", false, h, zerolog.New(io.Discard))
		if err != nil {
			t.Errorf("Listen([::1]:0): %v", err)
		} else {
			_ = srv.Close()
		}
	}
}

// Allowed on every interface, the server does not check Host: it is meant to
// be scraped by name from elsewhere.
func TestListenNonLoopbackAllowed(t *testing.T) {
	m := New(&fakeSource{snap: testSnapshot()}, zerolog.New(io.Discard))
	srv := serve(t, m.Handler(), "0.0.0.0:0", true)
	_, port, err := net.SplitHostPort(srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if r := get(t, srv, "GET", "/metrics", fmt.Sprintf("gpuhost.example:%s", port)); r.status != 200 {
		t.Errorf("non-loopback server refused a remote Host: %d %s", r.status, r.body)
	}
	// Allowed but asked for loopback: the Host check stays on.
	lo := serve(t, m.Handler(), "127.0.0.1:0", true)
	if r := get(t, lo, "GET", "/metrics", "evil.example"); r.status != 403 {
		t.Errorf("loopback server with allowNonLoopback accepted Host evil.example: %d", r.status)
	}
}

func TestReclaimedCounters(t *testing.T) {
	m := New(&fakeSource{}, zerolog.New(io.Discard))
	m.AddReclaimed(1, 100)
	m.AddReclaimed(0, 0)
	m.AddReclaimed(2, 50)
	if got := testutil.ToFloat64(m.reclaimedProcs); got != 3 {
		t.Errorf("reclaimed processes %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.reclaimedBytes); got != 150 {
		t.Errorf("reclaimed bytes %v, want 150", got)
	}
}

// Without the per-notebook family no series carries a kernel id or a
// notebook path; the per-user sums still add up to what the notebooks hold.
func TestPerNotebookOff(t *testing.T) {
	m := New(&fakeSource{snap: testSnapshot()}, zerolog.New(io.Discard), PerNotebook(false))
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "gpumem_notebook_gpu_memory_bytes" {
			t.Errorf("gpumem_notebook_gpu_memory_bytes exported with PerNotebook(false)")
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "notebook" || l.GetName() == "kernel_id" || strings.Contains(l.GetValue(), ".ipynb") {
					t.Errorf("%s has label %s=%q with PerNotebook(false)", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
	expected := `# HELP gpumem_user_gpu_memory_bytes GPU memory held by the processes of a user's notebook kernels, in bytes.
# TYPE gpumem_user_gpu_memory_bytes gauge
gpumem_user_gpu_memory_bytes{gpu="0",user="alice"} 7.516192768e+10
gpumem_user_gpu_memory_bytes{gpu="0",user="bob"} 1.073741824e+10
gpumem_user_gpu_memory_bytes{gpu="1",user="bob"} 1.073741824e+10
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(expected), "gpumem_user_gpu_memory_bytes"); err != nil {
		t.Error(err)
	}
}

// A kernel whose server says idle but whose processes compute on a GPU is
// in use: no idle series. An unknown utilization has no series, never 0.
func TestIdleSeriesAndUnknownUtilization(t *testing.T) {
	snap := testSnapshot()
	last := time.Unix(1767225600, 0)
	for i := range snap.Report.Notebooks {
		snap.Report.Notebooks[i].Activity = &attribution.Activity{ExecutionState: "idle", LastActivity: last, IdleSeconds: 3600}
	}
	m := New(&fakeSource{snap: snap}, zerolog.New(io.Discard))
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	labelsOf := func(name string) []string {
		var out []string
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, mt := range f.GetMetric() {
				var ls []string
				for _, l := range mt.GetLabel() {
					ls = append(ls, l.GetName()+"="+l.GetValue())
				}
				out = append(out, strings.Join(ls, ","))
			}
		}
		sort.Strings(out)
		return out
	}
	if got := labelsOf("gpumem_idle_gpu_memory_bytes"); len(got) != 1 || !strings.Contains(got[0], "kernel-b") {
		t.Errorf("idle series %v, want kernel-b's only (kernel-a computes, kernel-c holds nothing)", got)
	}
	for _, name := range []string{"gpumem_notebook_gpu_sm_utilization_ratio", "gpumem_gpu_sm_utilization_ratio", "gpumem_notebook_gpu_computing"} {
		for _, l := range labelsOf(name) {
			if strings.Contains(l, "gpu=1") || strings.Contains(l, "kernel-c") {
				t.Errorf("%s{%s}: an unknown figure exported", name, l)
			}
		}
	}
	lean := New(&fakeSource{snap: snap}, zerolog.New(io.Discard), PerNotebook(false))
	leanFams, err := lean.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range leanFams {
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "kernel_id" || l.GetName() == "notebook" || l.GetName() == "pid" {
					t.Errorf("PerNotebook(false) exports %s{%s=...}", f.GetName(), l.GetName())
				}
			}
		}
	}
}
