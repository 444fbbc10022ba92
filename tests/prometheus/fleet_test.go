package prometheus

// The fleet: N simulated nodes, each a real `gpumem serve` process with its
// own simulated GPUs and 100 kernels, scraped by one real Prometheus
// through the scrape job the Helm chart's ServiceMonitor makes, evaluating
// the shipped rules, answering the Grafana dashboard's queries.
//
// What is real: every daemon (its sampling, attribution, /metrics), the
// kernels it attaches to (fakekernel, tests/daemonbench: protocol-speaking
// kernels, each with its own ports and key; one process serves 100 of them
// and ten nodes share one such process, since 100 x 100 kernels' 50,000
// ports would not fit this machine's port range), Prometheus, its rules
// and its queries. What is played: each node's /proc (a fixture tree,
// GPUMEM_PROC_ROOT: one process per kernel, pids above any pid_max so none
// is ever this machine's, owning its kernel's shell port), its GPUs (the
// simulated-GPU file), and Kubernetes service discovery (a file_sd target
// list carrying the __meta_kubernetes_* labels that endpoints discovery
// gives, relabelled as prometheus-operator relabels a ServiceMonitor's
// targets). No Jupyter server runs: notebook labels are empty.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

const (
	fleetGPUs           = 8
	fleetKernelsPerNode = 100
	// Nodes that attach to one fakekernel process's kernels.
	fleetNodesPerKernelSet = 10
	// Fixture pids start above PID_MAX_LIMIT (4,194,304): no process of
	// this machine ever has one, so nothing the daemon does to a pid can
	// reach a real process.
	fleetPIDBase   = 5_000_000
	fleetInodeBase = 7_000_000
)

// fleetOptions says how big a fleet to run and how fast.
type fleetOptions struct {
	nodes int
	bin   string // gpumem
	// interval overrides the ServiceMonitor's scrape interval (and the
	// rules' evaluation interval) when not zero.
	interval time.Duration
	// forScale divides every rule's for: duration (1: the shipped rules).
	forScale int
	// window is how long the fleet is scraped before the dashboard's
	// queries run over its data.
	window time.Duration
	// idleWindow stands in for the dashboard's $idle_window (hours).
	idleWindow string
	// gpuHigh: also fill one node's GPU past the GPUMemoryHigh threshold
	// and empty it again, watching the alert fire and resolve.
	gpuHigh bool
}

// fleetFigures is what one fleet run measured.
type fleetFigures struct {
	nodes                        int
	seriesPerNode, seriesLean    int // scraped samples of a node (per notebook) and of the lean node
	headSeries                   int
	scrapeP50, scrapeP99, scrape time.Duration // scrape_duration_seconds over the window, across daemons: median, p99 and max of each one's mean
	scrapeDown                   time.Duration // the longest scrape of the daemon stopped and started again
	promRSS, promRSSMax          float64       // bytes
	promCPU                      float64       // cores, over the last minute
	queries                      []fleetQuery
	downFiring, downResolved     time.Duration // GPUMemExporterDown after its daemon stopped / restarted
	samplesPerSecond             float64
}

// fleetQuery is one dashboard query timed over the fleet's data: its
// evaluation time as Prometheus reports it (stats=all: no HTTP, no JSON),
// median and best of five, and the samples it read, which unlike the time
// does not depend on what else the machine runs.
type fleetQuery struct {
	dashboardQuery
	took, best    time.Duration
	wall          time.Duration // median of five round trips as Grafana makes them: the answer's JSON included
	series        int
	samples, peak int64
}

// kind is the query's refId and whether Grafana asks for a range or an
// instant.
func (q fleetQuery) kind() string {
	if q.instant {
		return q.refID + " (instant)"
	}
	return q.refID + " (range)"
}

// rangeStats is Prometheus's answer to a query with stats=all.
type rangeStats struct {
	Status   string   `json:"status"`
	Error    string   `json:"error"`
	Warnings []string `json:"warnings"`
	Data     struct {
		Result []json.RawMessage `json:"result"`
		Stats  struct {
			Timings struct {
				EvalTotalTime float64 `json:"evalTotalTime"`
			} `json:"timings"`
			Samples struct {
				TotalQueryableSamples int64 `json:"totalQueryableSamples"`
				PeakSamples           int64 `json:"peakSamples"`
			} `json:"samples"`
		} `json:"stats"`
	} `json:"data"`
}

// queryStats runs expr as Grafana asks for it, over r (query_range) or
// instant at r's end (query), with stats=all (the client library drops
// the stats); an error fails the test.
func (s *server) queryStats(tb testing.TB, expr string, r promv1.Range, instant bool) rangeStats {
	tb.Helper()
	form := url.Values{"query": {expr}, "start": {strconv.FormatInt(r.Start.Unix(), 10)},
		"end": {strconv.FormatInt(r.End.Unix(), 10)}, "step": {promDuration(r.Step)}, "stats": {"all"}}
	path := "/api/v1/query_range"
	if instant {
		form = url.Values{"query": {expr}, "time": {strconv.FormatInt(r.End.Unix(), 10)}, "stats": {"all"}}
		path = "/api/v1/query"
	}
	client := &http.Client{Timeout: 60 * time.Second}
	resp, err := client.PostForm(s.url+path, form)
	if err != nil {
		tb.Fatalf("%s %s: %v", path, expr, err)
	}
	defer resp.Body.Close()
	var st rangeStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Status != "success" {
		tb.Fatalf("%s %s: %s %v %s", path, expr, resp.Status, err, st.Error)
	}
	if st.Data.Stats.Samples.TotalQueryableSamples == 0 && len(st.Data.Result) > 0 {
		tb.Fatalf("%s %s: no sample statistics in the answer (stats=all)", path, expr)
	}
	return st
}

// fleetKernelSet is one fakekernel process and the connection files of
// its kernels.
type fleetKernelSet struct {
	proc  *testenv.Proc
	files []string
}

func startKernelSet(tb testing.TB, bin, dir string) *fleetKernelSet {
	tb.Helper()
	ks := &fleetKernelSet{}
	args := []string{bin}
	for k := range fleetKernelsPerNode {
		f := filepath.Join(dir, fmt.Sprintf("kernel-%03d.json", k))
		ks.files = append(ks.files, f)
		args = append(args, "-f", f)
	}
	ks.proc = testenv.Start(tb, testenv.Env(dir, "GOMAXPROCS=1"), dir, args...)
	testenv.Poll(tb, 60*time.Second, "fakekernel ready in "+dir, func() bool {
		if ks.proc.Exited() {
			tb.Fatalf("fakekernel exited:\n%s", ks.proc.Output())
		}
		return strings.HasPrefix(ks.proc.Output(), "ready\n")
	})
	return ks
}

// fleetNode is one simulated node: its dirs, fixture /proc, simulated GPUs
// and daemon.
type fleetNode struct {
	name, dir, addr, gpuFile string
	argv, env                []string
	proc                     *testenv.Proc
	gpus                     []testenv.SimGPU
	lean                     bool // --metrics-notebook-label=false
}

// newFleetNode lays out node i over the kernels of ks: its runtime dir
// holds a copy of each kernel's connection file under a kernel id of its
// own, and its fixture /proc a process per kernel that owns the kernel's
// shell port and names the copy in its argv, which is what the daemon
// proves a kernel by.
func newFleetNode(tb testing.TB, bin, base string, i int, ks *fleetKernelSet, lean bool) *fleetNode {
	tb.Helper()
	n := &fleetNode{name: fmt.Sprintf("node-%03d", i), lean: lean}
	n.dir = filepath.Join(base, n.name)
	runtime, root := filepath.Join(n.dir, "runtime"), filepath.Join(n.dir, "proc")
	for _, d := range []string{runtime, root, filepath.Join(n.dir, "home")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	procs := []procstest.Proc{{PID: 1, PGID: 1, SID: 1, Start: 1, Comm: "systemd", Argv: []string{"/sbin/init"}}}
	listen := map[int]uint64{}
	n.gpus = make([]testenv.SimGPU, fleetGPUs)
	for g := range n.gpus {
		n.gpus[g] = testenv.SimH200(g, 141<<30)
	}
	for k, src := range ks.files {
		data, err := os.ReadFile(src)
		if err != nil {
			tb.Fatal(err)
		}
		var conn struct {
			ShellPort int `json:"shell_port"`
		}
		if err := json.Unmarshal(data, &conn); err != nil || conn.ShellPort == 0 {
			tb.Fatalf("%s: no shell_port (%v)", src, err)
		}
		// A kernel id as Jupyter makes them (a UUID), unique in the fleet.
		id := fmt.Sprintf("%08x-%04x-4000-8000-%012x", 0xf1ee7000+i, k, i*1000+k)
		file := filepath.Join(runtime, "kernel-"+id+".json")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			tb.Fatal(err)
		}
		pid, inode := fleetPIDBase+k, uint64(fleetInodeBase+k)
		procs = append(procs, procstest.Proc{PID: pid, PPID: 1, PGID: pid, SID: pid, UID: uint32(os.Getuid()),
			Start: uint64(1000 + k), Comm: "python3", Argv: []string{"/usr/bin/python3", "-m", "ipykernel_launcher", "-f", file},
			Sockets: []uint64{inode}})
		listen[conn.ShellPort] = inode
		// 1-12 GiB each, on one GPU; a third of them computing.
		g := &n.gpus[k%fleetGPUs]
		g.Processes = append(g.Processes, testenv.FakeProc{PID: pid, UsedBytes: uint64(1+(k*7+i)%12) << 30,
			SMPercent: uint32(40 * (k % 3 / 2))})
	}
	procstest.WriteTree(tb, root, procs)
	procstest.WriteNet(tb, root, listen, nil)
	n.gpuFile = filepath.Join(n.dir, "gpus.json")
	testenv.WriteSimulatedGPUs(tb, n.gpuFile, n.gpus...)
	n.addr = fmt.Sprintf("127.0.0.1:%d", fleetPort(tb))
	// The chart's metrics-mode flags that apply off Kubernetes: no
	// injection, no reclaim; the default --interval (1 s).
	n.argv = []string{bin, "serve", "--listen=" + n.addr, "--log-format=json", "--no-inject", "--reclaim=false"}
	if lean {
		n.argv = append(n.argv, "--metrics-notebook-label=false")
	}
	n.env = testenv.Env(n.dir, "GPUMEM_FAKE_GPU="+n.gpuFile, "GPUMEM_PROC_ROOT="+root)
	return n
}

func (n *fleetNode) start(tb testing.TB) {
	tb.Helper()
	p := testenv.Start(tb, n.env, n.dir, n.argv...)
	n.proc = p
	tb.Cleanup(func() {
		if tb.Failed() && p == n.proc && p.Exited() { // not one the test stopped
			tb.Logf("%s: gpumem serve exited: %s", n.name, tail(p.Output(), 4000))
		}
	})
}

// tail is the end of a long output.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// ready reports whether the daemon's /metrics lists all its kernels.
func (n *fleetNode) ready(tb testing.TB) bool {
	if n.proc.Exited() {
		tb.Fatalf("%s: gpumem serve exited: %s", n.name, tail(n.proc.Output(), 4000))
	}
	text, err := scrapeText(tb, n.addr)
	if err != nil || !strings.Contains(text, fmt.Sprintf("\ngpumem_attached_kernels %d\n", fleetKernelsPerNode)) {
		return false
	}
	if n.lean {
		return strings.Contains(text, "\ngpumem_user_gpu_memory_bytes{")
	}
	return strings.Count(text, "\ngpumem_notebook_gpu_memory_bytes{") == fleetKernelsPerNode
}

var fleetPortNext int // the next port fleetPort tries; 0 before the first

// fleetPort returns a port on 127.0.0.1 that was free a moment ago, below
// the ephemeral range: the fleet's kernels bind, and its daemons and
// Prometheus dial from, ephemeral ports by the thousand, and one of those
// could take a daemon's port before it starts or while it is stopped.
func fleetPort(tb testing.TB) int {
	tb.Helper()
	if fleetPortNext == 0 {
		fleetPortNext = 32767
		if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
			if f := strings.Fields(string(data)); len(f) == 2 {
				if lo, err := strconv.Atoi(f[0]); err == nil && lo > 2048 {
					fleetPortNext = lo - 1
				}
			}
		}
	}
	for ; fleetPortNext > 1024; fleetPortNext-- {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", fleetPortNext))
		if err == nil {
			l.Close()
			fleetPortNext--
			return fleetPortNext + 1
		}
	}
	tb.Fatal("no free port on 127.0.0.1 below the ephemeral range")
	return 0
}

// chartObjects reads the objects of a manifest rendered from the chart
// (deploy/kubernetes, kept equal to `helm template` by tests/kube/check.sh).
func chartObjects(tb testing.TB, rel string) []map[string]any {
	tb.Helper()
	data, err := os.ReadFile(repoPath(tb, rel))
	if err != nil {
		tb.Fatal(err)
	}
	var out []map[string]any
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			tb.Fatalf("%s: %v", rel, err)
		}
		if obj != nil {
			out = append(out, obj)
		}
	}
	return out
}

// chartObject decodes the one object of kind in a rendered manifest.
func chartObject(tb testing.TB, rel, kind string, into any) {
	tb.Helper()
	for _, obj := range chartObjects(tb, rel) {
		if obj["kind"] == kind {
			data, err := json.Marshal(obj)
			if err == nil {
				err = json.Unmarshal(data, into)
			}
			if err != nil {
				tb.Fatalf("%s: %s: %v", rel, kind, err)
			}
			return
		}
	}
	tb.Fatalf("%s: no %s", rel, kind)
}

type chartMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
}

type chartServiceMonitor struct {
	Metadata chartMeta `json:"metadata"`
	Spec     struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
			Relabelings   []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
				Regex        string   `json:"regex"`
				Replacement  string   `json:"replacement"`
				Action       string   `json:"action"`
			} `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type chartService struct {
	Metadata chartMeta `json:"metadata"`
	Spec     struct {
		Ports []struct {
			Name string `json:"name"`
		} `json:"ports"`
	} `json:"spec"`
}

// sdLabelName is how Kubernetes service discovery names a label's meta
// label: every character outside [a-zA-Z0-9_] becomes "_".
func sdLabelName(l string) string {
	return regexp.MustCompile(`[^a-zA-Z0-9_]`).ReplaceAllString(l, "_")
}

// fleetScrapeConfig is the Prometheus configuration of the fleet: the
// scrape job prometheus-operator generates from the chart's ServiceMonitor
// (its selector, port, path, interval, timeout and relabelings, and the
// operator's own target labels), with a file_sd list in place of
// Kubernetes endpoints discovery; the shipped rules; and Prometheus
// scraping itself (its memory).
func fleetScrapeConfig(tb testing.TB, o fleetOptions, rules, targetsFile, self string) string {
	tb.Helper()
	var sm chartServiceMonitor
	chartObject(tb, "deploy/kubernetes/servicemonitor.yaml", "ServiceMonitor", &sm)
	if len(sm.Spec.Endpoints) != 1 {
		tb.Fatalf("the ServiceMonitor has %d endpoints, the fleet plays one", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	interval, timeout := ep.Interval, ep.ScrapeTimeout
	if o.interval != 0 {
		interval, timeout = promDuration(o.interval), promDuration(o.interval)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\n", interval, interval)
	fmt.Fprintf(&b, "rule_files:\n  - %q\n", rules)
	fmt.Fprintf(&b, "scrape_configs:\n  - job_name: serviceMonitor/%s/%s/0\n", sm.Metadata.Namespace, sm.Metadata.Name)
	fmt.Fprintf(&b, "    honor_labels: false\n    scrape_interval: %s\n    scrape_timeout: %s\n    metrics_path: %s\n", interval, timeout, ep.Path)
	fmt.Fprintf(&b, "    file_sd_configs:\n      - files: [%q]\n        refresh_interval: 5s\n", targetsFile)
	b.WriteString("    relabel_configs:\n")
	relabel := func(src []string, target, regex, replacement, action string) {
		b.WriteString("      - ")
		indent := ""
		line := func(format string, args ...any) {
			b.WriteString(indent)
			fmt.Fprintf(&b, format, args...)
			b.WriteString("\n")
			indent = "        "
		}
		if len(src) > 0 {
			line("source_labels: [%s]", strings.Join(src, ", "))
		}
		if target != "" {
			line("target_label: %s", target)
		}
		if regex != "" {
			line("regex: %q", regex)
		}
		if replacement != "" {
			line("replacement: %q", replacement)
		}
		if action != "" {
			line("action: %s", action)
		}
	}
	// The operator's: the namespaces and the service's labels selected,
	// the endpoint's port by name.
	relabel([]string{"__meta_kubernetes_namespace"}, "", "("+strings.Join(sm.Spec.NamespaceSelector.MatchNames, "|")+")", "", "keep")
	keys := make([]string, 0, len(sm.Spec.Selector.MatchLabels))
	for k := range sm.Spec.Selector.MatchLabels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		relabel([]string{"__meta_kubernetes_service_label_" + sdLabelName(k), "__meta_kubernetes_service_labelpresent_" + sdLabelName(k)},
			"", "("+regexp.QuoteMeta(sm.Spec.Selector.MatchLabels[k])+");true", "", "keep")
	}
	relabel([]string{"__meta_kubernetes_endpoint_port_name"}, "", ep.Port, "", "keep")
	for _, l := range []struct{ src, target string }{
		{"__meta_kubernetes_namespace", "namespace"}, {"__meta_kubernetes_service_name", "service"},
		{"__meta_kubernetes_pod_name", "pod"}, {"__meta_kubernetes_pod_container_name", "container"},
		{"__meta_kubernetes_service_name", "job"},
	} {
		relabel([]string{l.src}, l.target, "", "", "")
	}
	relabel(nil, "endpoint", "", ep.Port, "")
	// The ServiceMonitor's own.
	for _, r := range ep.Relabelings {
		relabel(r.SourceLabels, r.TargetLabel, r.Regex, r.Replacement, strings.ToLower(r.Action))
	}
	fmt.Fprintf(&b, "  - job_name: prometheus\n    static_configs:\n      - targets: [%q]\n", self)
	return b.String()
}

// fleetTargets writes the file_sd list: one target per node, with the meta
// labels endpoints discovery gives the chart's Service's endpoint on that
// node's pod.
func fleetTargets(tb testing.TB, path string, nodes []*fleetNode) {
	tb.Helper()
	var svc chartService
	chartObject(tb, "deploy/kubernetes/gpumem.yaml", "Service", &svc)
	if len(svc.Spec.Ports) != 1 {
		tb.Fatalf("the chart's Service has %d ports, the fleet plays one", len(svc.Spec.Ports))
	}
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var groups []group
	for _, n := range nodes {
		l := map[string]string{
			"__meta_kubernetes_namespace":             svc.Metadata.Namespace,
			"__meta_kubernetes_service_name":          svc.Metadata.Name,
			"__meta_kubernetes_endpoint_port_name":    svc.Spec.Ports[0].Name,
			"__meta_kubernetes_pod_name":              svc.Metadata.Name + "-" + strings.TrimPrefix(n.name, "node-"),
			"__meta_kubernetes_pod_container_name":    "gpumem",
			"__meta_kubernetes_pod_node_name":         n.name,
			"__meta_kubernetes_endpoint_ready":        "true",
			"__meta_kubernetes_endpoint_address_type": "IPv4",
		}
		for k, v := range svc.Metadata.Labels {
			l["__meta_kubernetes_service_label_"+sdLabelName(k)] = v
			l["__meta_kubernetes_service_labelpresent_"+sdLabelName(k)] = "true"
		}
		groups = append(groups, group{Targets: []string{n.addr}, Labels: l})
	}
	data, err := json.MarshalIndent(groups, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
}

var forRE = regexp.MustCompile(`(?m)^(\s+for:\s*)(\d+)m\s*$`)

// scaledRules writes the shipped rules with every for: divided by scale,
// so that a test sees an alert fire in seconds; promtool's unit tests
// (TestPromtoolRules) check the real durations.
func scaledRules(tb testing.TB, dir string, scale int) string {
	tb.Helper()
	src := repoPath(tb, "deploy/prometheus/gpumem-rules.yml")
	if scale <= 1 {
		return src
	}
	data, err := os.ReadFile(src)
	if err != nil {
		tb.Fatal(err)
	}
	if !forRE.Match(data) {
		tb.Fatalf("%s: no for: in minutes to scale", src)
	}
	out := forRE.ReplaceAllFunc(data, func(m []byte) []byte {
		sub := forRE.FindSubmatch(m)
		mins, _ := strconv.Atoi(string(sub[2]))
		return []byte(fmt.Sprintf("%s%ds", sub[1], mins*60/scale))
	})
	path := filepath.Join(dir, "gpumem-rules.yml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// ruleFor is the for: of alert name in the rules file at path.
func ruleFor(tb testing.TB, path, name string) time.Duration {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	m := regexp.MustCompile(`- alert: ` + name + `\n(?:.*\n)*?\s+for:\s*(\S+)`).FindSubmatch(data)
	if m == nil {
		tb.Fatalf("%s: alert %s has no for:", path, name)
	}
	d, err := model.ParseDuration(string(m[1]))
	if err != nil {
		tb.Fatal(err)
	}
	return time.Duration(d)
}

// runFleet starts o.nodes daemons and one Prometheus, drives alerts, runs
// the dashboard, and returns the figures. Everything it starts ends in
// tb's Cleanup.
func runFleet(tb testing.TB, o fleetOptions) fleetFigures {
	tb.Helper()
	base := tb.TempDir()
	fk, err := testenv.GoBuild(base, "fakekernel", "./tests/daemonbench/fakekernel", false)
	if err != nil {
		tb.Fatal(err)
	}
	began := time.Now()
	var sets []*fleetKernelSet
	for s := 0; s*fleetNodesPerKernelSet < o.nodes; s++ {
		dir := filepath.Join(base, fmt.Sprintf("kernels-%02d", s))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			tb.Fatal(err)
		}
		sets = append(sets, startKernelSet(tb, fk, dir))
	}
	nodes := make([]*fleetNode, o.nodes)
	for i := range nodes {
		// The last node keeps kernel ids out of Prometheus, as some fleets
		// do: the dashboard's per-user fallback panels have a host to show.
		nodes[i] = newFleetNode(tb, o.bin, base, i, sets[i/fleetNodesPerKernelSet], i == o.nodes-1)
		nodes[i].start(tb)
	}
	deadline := time.Now().Add(time.Duration(30+o.nodes) * time.Second)
	for _, n := range nodes {
		testenv.Poll(tb, time.Until(deadline), n.name+"'s daemon listing its kernels on "+n.addr, func() bool { return n.ready(tb) })
	}
	tb.Logf("%d daemons with %d kernels each ready in %v (%d fakekernel processes)", o.nodes, fleetKernelsPerNode,
		time.Since(began).Round(time.Second), len(sets))

	promDir := filepath.Join(base, "prometheus")
	if err := os.MkdirAll(promDir, 0o700); err != nil {
		tb.Fatal(err)
	}
	rules := scaledRules(tb, promDir, o.forScale)
	targets := filepath.Join(promDir, "targets.json")
	fleetTargets(tb, targets, nodes)
	prom := startPrometheusConfig(tb, promDir, fleetPort(tb), func(self string) string {
		return fleetScrapeConfig(tb, o, rules, targets, self)
	})
	var sm chartServiceMonitor
	chartObject(tb, "deploy/kubernetes/servicemonitor.yaml", "ServiceMonitor", &sm)
	interval := o.interval
	if interval == 0 {
		d, err := model.ParseDuration(sm.Spec.Endpoints[0].Interval)
		if err != nil {
			tb.Fatal(err)
		}
		interval = time.Duration(d)
	}
	job := sm.Metadata.Name // the operator's job label: the Service's name
	prom.waitQueryFor(tb, 3*interval+30*time.Second, fmt.Sprintf(`up{job=%q} == 1`, job), "every daemon up",
		func(v model.Vector) bool { return len(v) == o.nodes })
	v := prom.query(tb, fmt.Sprintf(`count by (node) (up{job=%q,namespace=%q,service=%q,endpoint="metrics",node=~"node-.+"})`,
		job, sm.Metadata.Namespace, job))
	if len(v) != o.nodes {
		tb.Fatalf("targets by node: %v, want %d nodes labelled as the ServiceMonitor labels them", v, o.nodes)
	}

	f := fleetFigures{nodes: o.nodes}
	// An alert through its life on the fleet: one node's daemon stops, the
	// alert goes pending, then fires once its for: has passed; the daemon
	// starts again and the alert resolves.
	down := nodes[0]
	downFor := ruleFor(tb, rules, "GPUMemExporterDown")
	down.proc.Kill()
	stopped := time.Now()
	evalSlack := 3*interval + 20*time.Second
	a := waitAlert(tb, prom, "GPUMemExporterDown", down.addr, "pending", evalSlack)
	a = waitAlert(tb, prom, "GPUMemExporterDown", down.addr, "firing", downFor+evalSlack)
	f.downFiring = time.Since(stopped)
	if time.Since(a.ActiveAt) < downFor {
		tb.Errorf("GPUMemExporterDown firing %v after it went pending: its for: is %v", time.Since(a.ActiveAt), downFor)
	}
	if a.Labels["node"] != model.LabelValue(down.name) || a.Labels["severity"] != "warning" {
		tb.Errorf("GPUMemExporterDown labels %v: want node %s, severity warning", a.Labels, down.name)
	}
	down.start(tb)
	restarted := time.Now()
	waitNoAlert(tb, prom, "GPUMemExporterDown", down.addr, evalSlack)
	f.downResolved = time.Since(restarted)
	tb.Logf("GPUMemExporterDown (for: %v) on %s: firing %v after its daemon stopped, resolved %v after it started again",
		downFor, down.name, f.downFiring.Round(time.Second), f.downResolved.Round(time.Second))

	if o.gpuHigh {
		// One node's GPU 0 filled to 90 % by a process of no kernel, then
		// given back.
		hot := nodes[1%o.nodes]
		highFor := ruleFor(tb, rules, "GPUMemoryHigh")
		gpus := append([]testenv.SimGPU(nil), hot.gpus...)
		used := uint64(0)
		for _, p := range gpus[0].Processes {
			used += p.UsedBytes
		}
		gpus[0].Processes = append(append([]testenv.FakeProc(nil), gpus[0].Processes...),
			testenv.FakeProc{PID: fleetPIDBase + 999_999, UsedBytes: gpus[0].MemoryTotalBytes*9/10 - used})
		testenv.WriteSimulatedGPUs(tb, hot.gpuFile, gpus...)
		waitAlert(tb, prom, "GPUMemoryHigh", hot.addr, "pending", evalSlack)
		a := waitAlert(tb, prom, "GPUMemoryHigh", hot.addr, "firing", highFor+evalSlack)
		if a.Labels["gpu"] != "0" || !strings.Contains(string(a.Annotations["summary"]), "GPU 0 (Simulated H200) on "+hot.addr+" is ") ||
			!strings.HasPrefix(string(a.Annotations["description"]), "Top notebooks:") {
			tb.Errorf("GPUMemoryHigh %v %v", a.Labels, a.Annotations)
		}
		testenv.WriteSimulatedGPUs(tb, hot.gpuFile, hot.gpus...)
		waitNoAlert(tb, prom, "GPUMemoryHigh", hot.addr, evalSlack)
		tb.Logf("GPUMemoryHigh (for: %v) on %s: fired and resolved; %s", highFor, hot.name, a.Annotations["summary"])
	}

	// The steady window: the fleet's data the dashboard reads.
	for time.Since(prom.started) < o.window {
		time.Sleep(time.Second)
	}

	scalar := func(expr string) float64 {
		v := prom.query(tb, expr)
		if len(v) != 1 {
			tb.Fatalf("%s: %v, want one sample", expr, v)
		}
		return float64(v[0].Value)
	}
	lean := nodes[len(nodes)-1]
	f.seriesPerNode = int(scalar(fmt.Sprintf(`max(scrape_samples_scraped{job=%q,node!=%q})`, job, lean.name)))
	f.seriesLean = int(scalar(fmt.Sprintf(`scrape_samples_scraped{job=%q,node=%q}`, job, lean.name)))
	f.headSeries = int(scalar(`prometheus_tsdb_head_series{job="prometheus"}`))
	f.promRSS = scalar(`process_resident_memory_bytes{job="prometheus"}`)
	f.promRSSMax = scalar(`max_over_time(process_resident_memory_bytes{job="prometheus"}[1h])`)
	f.promCPU = scalar(`rate(process_cpu_seconds_total{job="prometheus"}[1m])`)
	f.samplesPerSecond = scalar(`sum(rate(prometheus_tsdb_head_samples_appended_total{job="prometheus"}[1m]))`)
	// Each daemon's mean scrape duration over the window, but the one
	// stopped and started again (its longest scrape apart).
	span := promDuration(time.Since(prom.started).Truncate(time.Second))
	means := prom.query(tb, fmt.Sprintf(`avg_over_time(scrape_duration_seconds{job=%q,node!=%q}[%s])`, job, down.name, span))
	if len(means) != o.nodes-1 {
		tb.Fatalf("scrape durations of %d daemons, want %d", len(means), o.nodes-1)
	}
	f.scrapeDown = time.Duration(scalar(fmt.Sprintf(`max_over_time(scrape_duration_seconds{job=%q,node=%q}[%s])`, job, down.name, span)) * float64(time.Second))
	var secs []float64
	for _, s := range means {
		secs = append(secs, float64(s.Value))
	}
	sort.Float64s(secs)
	at := func(q float64) time.Duration {
		return time.Duration(secs[int(math.Ceil(q*float64(len(secs))))-1] * float64(time.Second))
	}
	f.scrapeP50, f.scrapeP99, f.scrape = at(0.5), at(0.99), at(1)
	if f.seriesPerNode < fleetKernelsPerNode*3 {
		tb.Errorf("%d series per node: fewer than 3 per kernel", f.seriesPerNode)
	}

	// Every dashboard query over the fleet's data, as a Grafana panel over
	// the time range asks for it: a range at the scrape interval, or the
	// value at its end where the panel is instant (stats, tables).
	r := promv1.Range{Start: prom.started, End: time.Now(), Step: interval}
	for _, q := range dashboardQueries(tb, prom, repoPath(tb, "deploy/grafana/gpumem.json"), interval, o.idleWindow) {
		fq := fleetQuery{dashboardQuery: q}
		var evals, walls []time.Duration
		for range 5 {
			t0 := time.Now()
			st := prom.queryStats(tb, q.expr, r, q.instant)
			walls = append(walls, time.Since(t0))
			if len(st.Warnings) > 0 {
				tb.Logf("panel %q %s: warnings %v", q.panel, q.refID, st.Warnings)
			}
			evals = append(evals, time.Duration(st.Data.Stats.Timings.EvalTotalTime*float64(time.Second)))
			fq.series, fq.samples, fq.peak = len(st.Data.Result), st.Data.Stats.Samples.TotalQueryableSamples, st.Data.Stats.Samples.PeakSamples
		}
		if fq.series == 0 {
			tb.Errorf("panel %q %s: no data over the fleet's %v from %s", q.panel, q.refID, r.End.Sub(r.Start).Round(time.Second), q.expr)
		}
		slices.Sort(evals)
		slices.Sort(walls)
		fq.best, fq.took, fq.wall = evals[0], evals[len(evals)/2], walls[len(walls)/2]
		f.queries = append(f.queries, fq)
	}
	f.log(tb)
	return f
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (f fleetFigures) log(tb testing.TB) {
	tb.Helper()
	var b bytes.Buffer
	fmt.Fprintf(&b, "fleet of %d nodes: %d series per node (%d on the node without notebook labels), %d head series, %.0f samples/s\n",
		f.nodes, f.seriesPerNode, f.seriesLean, f.headSeries, f.samplesPerSecond)
	fmt.Fprintf(&b, "scrape_duration_seconds, each daemon's mean: median %v, p99 %v, max %v (the restarted daemon's longest: %v)\n",
		f.scrapeP50.Round(10*time.Microsecond), f.scrapeP99.Round(10*time.Microsecond), f.scrape.Round(10*time.Microsecond),
		f.scrapeDown.Round(10*time.Microsecond))
	fmt.Fprintf(&b, "Prometheus process_resident_memory_bytes: %.1f MiB now, %.1f MiB max; CPU %.1f %% of a core over the last minute; load average %.1f\n",
		f.promRSS/(1<<20), f.promRSSMax/(1<<20), 100*f.promCPU, testenv.LoadAverage())
	qs := append([]fleetQuery(nil), f.queries...)
	sort.SliceStable(qs, func(i, j int) bool { return qs[i].took > qs[j].took })
	for _, q := range qs {
		fmt.Fprintf(&b, "  eval %8.2f ms (best %8.2f), round trip %8.2f ms, %6d series, %10d samples (peak %8d)  %s %s: %s\n", ms(q.took), ms(q.best), ms(q.wall), q.series,
			q.samples, q.peak, q.panel, q.kind(), q.raw)
	}
	tb.Log(b.String())
}

// waitAlert polls /api/v1/alerts until alert name of instance is in state,
// and returns it.
func waitAlert(tb testing.TB, prom *server, name, instance, state string, timeout time.Duration) promv1.Alert {
	tb.Helper()
	var found promv1.Alert
	testenv.Poll(tb, timeout, fmt.Sprintf("%s %s on %s", name, state, instance), func() bool {
		for _, a := range alertsNamed(tb, prom, name) {
			if string(a.Labels["instance"]) == instance && string(a.State) == state {
				found = a
				return true
			}
		}
		return false
	})
	return found
}

// waitNoAlert polls /api/v1/alerts until alert name of instance is neither
// pending nor firing (resolved).
func waitNoAlert(tb testing.TB, prom *server, name, instance string, timeout time.Duration) {
	tb.Helper()
	testenv.Poll(tb, timeout, fmt.Sprintf("%s on %s resolved", name, instance), func() bool {
		for _, a := range alertsNamed(tb, prom, name) {
			if string(a.Labels["instance"]) == instance {
				return false
			}
		}
		return true
	})
}

func alertsNamed(tb testing.TB, prom *server, name string) []promv1.Alert {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := prom.api.Alerts(ctx)
	if err != nil {
		tb.Fatalf("alerts: %v", err)
	}
	var out []promv1.Alert
	for _, a := range res.Alerts {
		if string(a.Labels["alertname"]) == name {
			out = append(out, a)
		}
	}
	return out
}

// TestFleet: ten nodes' daemons, each with 100 kernels on 8 simulated GPUs,
// scraped by one Prometheus through the chart's ServiceMonitor job (every
// second here, the rules' for: divided by 30): every target up and
// labelled by node, GPUMemExporterDown and GPUMemoryHigh fire and resolve
// on the live fleet, and every dashboard query returns data.
// BenchmarkFleetPrometheus is the same at 25, 50 and 100 nodes at the
// chart's own intervals, with the figures.
func TestFleet(t *testing.T) {
	requireTool(t, "prometheus")
	if s := testenv.CurrentStack(); s != testenv.Debian12 {
		t.Skipf("the fleet runs no Jupyter stack: it runs once, on %s, not again on %s", testenv.Debian12, s)
	}
	runFleet(t, fleetOptions{nodes: 10, bin: gpumemBin, interval: time.Second, forScale: 30,
		window: 20 * time.Second, idleWindow: "5s", gpuHigh: true})
}

// BenchmarkFleetPrometheus runs the fleet at FLEET_NODES nodes (default
// 25,50,100) in turn, each with a Prometheus of its own, at the chart's
// scrape interval and the shipped rules unchanged (GPUMemExporterDown's 2
// minutes included), scraped for FLEET_WINDOW (default 4m) before the
// dashboard's queries; then, for each query, how its time grew with the
// fleet and what that growth gives at 1,000 nodes.
//
//	go test ./tests/prometheus/ -run '^$' -bench FleetPrometheus -benchtime 1x -timeout 60m -v
//
// Without -bench, go test runs none of it.
func BenchmarkFleetPrometheus(b *testing.B) {
	requireTool(b, "prometheus")
	sizes := []int{25, 50, 100}
	if v := os.Getenv("FLEET_NODES"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2 {
				b.Fatalf("FLEET_NODES=%q: want a comma-separated list of node counts of 2 or more", v)
			}
			sizes = append(sizes, n)
		}
	}
	window := 4 * time.Minute
	if v := os.Getenv("FLEET_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("FLEET_WINDOW=%q: %v", v, err)
		}
		window = d
	}
	// The binary users run, not the race detector's.
	bin, err := testenv.GoBuild(b.TempDir(), "gpumem", "./cmd/gpumem", false)
	if err != nil {
		b.Fatal(err)
	}
	var runs []fleetFigures
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for range b.N {
				f := runFleet(b, fleetOptions{nodes: n, bin: bin, forScale: 1, window: window, idleWindow: "3m"})
				runs = append(runs, f)
				b.ReportMetric(float64(f.seriesPerNode), "series/node")
				b.ReportMetric(ms(f.scrapeP50), "scrape-p50-ms")
				b.ReportMetric(f.promRSS/(1<<20), "prometheus-rss-MiB")
				slowest := f.queries[0]
				for _, q := range f.queries {
					if q.took > slowest.took {
						slowest = q
					}
				}
				b.ReportMetric(ms(slowest.took), "slowest-query-ms")
			}
		})
	}
	if len(runs) >= 2 {
		b.Log(fleetScaling(runs))
	}
}

// fleetScaling tabulates each dashboard query's best evaluation time and
// samples read at each fleet size, the exponent k of samples ∝ nodes^k
// between the smallest and largest fleet (the samples, unlike the times, do
// not depend on the machine's load), and the time at 1,000 nodes if it
// grows as the samples do.
func fleetScaling(runs []fleetFigures) string {
	first, last := runs[0], runs[len(runs)-1]
	grow := float64(last.nodes) / float64(first.nodes)
	var b strings.Builder
	b.WriteString("dashboard queries by fleet size: best of 5 evaluations (ms), samples read, the median round trip at the largest; k: samples ∝ nodes^k\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "%9d", r.nodes)
	}
	for _, r := range runs {
		fmt.Fprintf(&b, "%12d", r.nodes)
	}
	fmt.Fprintf(&b, "  trip@%d      k  ms at 1,000  query\n", last.nodes)
	type row struct {
		line string
		at   float64
	}
	var rows []row
	for i, q := range last.queries {
		var line strings.Builder
		for _, r := range runs {
			fmt.Fprintf(&line, "%9.1f", ms(r.queries[i].best))
		}
		for _, r := range runs {
			fmt.Fprintf(&line, "%12d", r.queries[i].samples)
		}
		k := 0.0
		if s0 := first.queries[i].samples; s0 > 0 && q.samples > 0 {
			k = math.Log(float64(q.samples)/float64(s0)) / math.Log(grow)
		}
		at := ms(q.best) * math.Pow(1000/float64(last.nodes), math.Max(k, 0))
		fmt.Fprintf(&line, "%10.1f%7.2f%13.0f  %s %s: %s\n", ms(q.wall), k, at, q.panel, q.kind(), q.raw)
		rows = append(rows, row{line.String(), at})
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].at > rows[j].at })
	for _, r := range rows {
		b.WriteString(r.line)
	}
	b.WriteString("fleet figures by size:\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "  %d nodes: %d series/node, %d head series, scrape p50/p99/max %v/%v/%v (restarted daemon's longest %v), Prometheus RSS %.0f MiB (max %.0f), CPU %.0f %%, %.0f samples/s; GPUMemExporterDown firing %v after the stop, resolved %v after the restart\n",
			r.nodes, r.seriesPerNode, r.headSeries, r.scrapeP50.Round(10*time.Microsecond), r.scrapeP99.Round(10*time.Microsecond),
			r.scrape.Round(10*time.Microsecond), r.scrapeDown.Round(10*time.Microsecond), r.promRSS/(1<<20), r.promRSSMax/(1<<20), 100*r.promCPU, r.samplesPerSecond,
			r.downFiring.Round(time.Second), r.downResolved.Round(time.Second))
	}
	return b.String()
}
