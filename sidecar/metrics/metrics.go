// Package metrics owns gpumem's Prometheus metrics: a collector over the
// daemon's current snapshot (so the series of a vanished kernel or GPU
// disappear with it), the counters of reclaimed memory, the /metrics handler
// and a loopback-only HTTP server for it. It must not sample anything itself:
// the daemon hands it snapshots through Source.
package metrics

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// Snapshot is what the daemon knows after its last sample.
type Snapshot struct {
	Report attribution.Report
	// AttachedKernels is the number of kernels the daemon is attached to.
	AttachedKernels int
	// SampleDuration is how long the last sample took.
	SampleDuration time.Duration
	// SampleSuccess is whether the last sample succeeded.
	SampleSuccess bool
	// SampledAt is when the last successful sample was taken; zero before the first.
	SampledAt time.Time
	// AlertThreshold is the alert level as a fraction of a GPU's memory
	// (0.8 = 80%); 0 or less disables alerts. Which GPUs are over it is
	// the report's (its threshold alerts).
	AlertThreshold float64
	// Steps are the last sample's steps, in order, each timed.
	Steps []StepTiming
}

// StepTiming is how long one step of a sample took, and whether it
// succeeded.
type StepTiming struct {
	Step     string
	Duration time.Duration
	Success  bool
}

// Source gives the current snapshot. It is called on every scrape, from the
// HTTP server's goroutines: it must be cheap and safe for concurrent use, and
// the Report it returns must not be modified afterwards.
type Source interface {
	Snapshot() Snapshot
}

var (
	gpuLabels      = []string{"gpu", "uuid", "name"}
	notebookLabels = []string{"kernel_id", "notebook", "gpu", "user"}

	descGPUTotal = prometheus.NewDesc("gpumem_gpu_memory_total_bytes",
		"Total memory of the GPU in bytes.", gpuLabels, nil)
	descGPUUsed = prometheus.NewDesc("gpumem_gpu_memory_used_bytes",
		"Memory in use on the GPU in bytes, as the driver reports it (driver-reserved memory included).", gpuLabels, nil)
	descNotebook = prometheus.NewDesc("gpumem_notebook_gpu_memory_bytes",
		"GPU memory held by the processes of a notebook's kernel, in bytes.", notebookLabels, nil)
	descNotebookPeak = prometheus.NewDesc("gpumem_notebook_gpu_memory_peak_bytes",
		"Highest GPU memory of a notebook's kernel (all GPUs) since its process started, as the daemon sampled it, in bytes.",
		[]string{"kernel_id", "notebook", "user"}, nil)
	descUser = prometheus.NewDesc("gpumem_user_gpu_memory_bytes",
		"GPU memory held by the processes of a user's notebook kernels, in bytes.", []string{"gpu", "user"}, nil)
	descOther = prometheus.NewDesc("gpumem_other_gpu_memory_bytes",
		"GPU memory held by processes that belong to no kernel, in bytes.", []string{"gpu"}, nil)
	descAlert = prometheus.NewDesc("gpumem_gpu_memory_alert",
		"1 when the GPU's used memory is at or above the alert threshold, else 0.", []string{"gpu"}, nil)
	descThreshold = prometheus.NewDesc("gpumem_gpu_memory_alert_threshold_ratio",
		"Alert threshold as a fraction of a GPU's memory; 0 when alerts are off.", nil, nil)
	descAttached = prometheus.NewDesc("gpumem_attached_kernels",
		"Number of Jupyter kernels the daemon is attached to.", nil, nil)
	descSampleDuration = prometheus.NewDesc("gpumem_sample_duration_seconds",
		"Duration of the last sample of GPU memory, in seconds.", nil, nil)
	descSampleSuccess = prometheus.NewDesc("gpumem_sample_success",
		"1 when the last sample of GPU memory succeeded, else 0.", nil, nil)
	descSampleTime = prometheus.NewDesc("gpumem_last_sample_timestamp_seconds",
		"Unix time of the last successful sample of GPU memory.", nil, nil)
	idleLabels    = []string{"kernel_id", "notebook", "user"}
	descIdleBytes = prometheus.NewDesc("gpumem_idle_gpu_memory_bytes",
		"GPU memory held by an idle kernel (its server reports it idle and none of its processes computes on a GPU), in bytes.", idleLabels, nil)
	descIdleSeconds = prometheus.NewDesc("gpumem_kernel_idle_seconds",
		"How long a kernel that holds GPU memory has been idle, by its server's last_activity and its processes' last work on a GPU, in seconds.", idleLabels, nil)
	descStepDuration = prometheus.NewDesc("gpumem_sample_step_duration_seconds",
		"Duration of each step of the last sample (observe, retire, resolve, compute, cull, finish, history, alerts, publish), in seconds.",
		[]string{"step"}, nil)
	descStepSuccess = prometheus.NewDesc("gpumem_sample_step_success",
		"1 when the step of the last sample succeeded, else 0.", []string{"step"}, nil)
	descSimulated = prometheus.NewDesc("gpumem_simulated",
		"1 when the GPU figures come from a simulated-GPU file, not from the driver.", nil, nil)
)

// snapshotCollector turns each scrape's snapshot into const metrics: no
// state survives between scrapes, so nothing goes stale.
type snapshotCollector struct {
	src Source
	// perNotebook emits gpumem_notebook_gpu_memory_bytes. Each kernel a user
	// starts is a new series (kernel_id, notebook): on a large fleet that
	// churn, not the GPUs, is what fills Prometheus, so it can be turned off,
	// leaving the per-user series, bounded by users × GPUs.
	perNotebook bool
}

func (c snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGPUTotal, descGPUUsed, descUser, descOther, descAlert,
		descThreshold, descAttached, descSampleDuration, descSampleSuccess, descSampleTime, descSimulated,
		descStepDuration, descStepSuccess} {
		ch <- d
	}
	if c.perNotebook {
		ch <- descNotebook
		ch <- descNotebookPeak
		ch <- descIdleBytes
		ch <- descIdleSeconds
	}
}

func (c snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.src.Snapshot()
	s := newSeries(ch)
	simulated := collectGPUs(s, snap.Report)
	collectHolders(s, snap.Report, c.perNotebook)
	if c.perNotebook {
		collectKernels(s, snap.Report)
	}
	collectDaemon(s, snap, simulated)
}

// collectGPUs sends each GPU's memory and alert series, and says whether
// any GPU is simulated.
func collectGPUs(s *series, rep attribution.Report) (simulated bool) {
	alerting := map[int]bool{}
	for _, a := range rep.Alerts {
		if a.Kind == attribution.AlertThreshold {
			alerting[a.GPU] = true
		}
	}
	seenGPU := map[int]bool{}
	for _, g := range rep.GPUs {
		// Two entries with one index: the first is the GPU (its uuid and
		// name label the series; a second set of them would be a second GPU).
		if seenGPU[g.Index] {
			continue
		}
		seenGPU[g.Index] = true
		idx := strconv.Itoa(g.Index)
		s.gauge(descGPUTotal, float64(g.MemoryTotalBytes), idx, g.UUID, g.Name)
		s.gauge(descGPUUsed, float64(g.MemoryUsedBytes), idx, g.UUID, g.Name)
		s.gauge(descOther, float64(g.OtherBytes), idx)
		s.gauge(descAlert, boolFloat(alerting[g.Index]), idx)
		simulated = simulated || g.Simulated
	}
	return simulated
}

// collectHolders sends the bytes each notebook (when perNotebook) and each
// user holds per GPU; entries that label alike are summed.
func collectHolders(s *series, rep attribution.Report, perNotebook bool) {
	type nbKey struct {
		kernelID, notebook, user string
		gpu                      int
	}
	type userKey struct {
		user string
		gpu  int
	}
	var order []nbKey
	var userOrder []userKey
	bytes := map[nbKey]uint64{}
	userBytes := map[userKey]uint64{}
	for _, nb := range rep.Notebooks {
		for _, g := range nb.PerGPU {
			k := nbKey{textsafe.Label(nb.KernelID), textsafe.Label(nb.Notebook), textsafe.Label(nb.User), g.Index}
			if _, ok := bytes[k]; !ok {
				order = append(order, k)
			}
			bytes[k] += g.Bytes
			u := userKey{textsafe.Label(nb.User), g.Index}
			if _, ok := userBytes[u]; !ok {
				userOrder = append(userOrder, u)
			}
			userBytes[u] += g.Bytes
		}
	}
	if perNotebook {
		for _, k := range order {
			s.gauge(descNotebook, float64(bytes[k]), k.kernelID, k.notebook, strconv.Itoa(k.gpu), k.user)
		}
	}
	for _, u := range userOrder {
		s.gauge(descUser, float64(userBytes[u]), strconv.Itoa(u.gpu), u.user)
	}
}

// collectKernels sends the per-kernel series: the idle GPU holders (what
// GPU-aware culling acts on) and each kernel's peak. Labelled by kernel
// and notebook, so dropped with them; one series per kernel.
func collectKernels(s *series, rep attribution.Report) {
	seenIdle, seenPeak := map[string]bool{}, map[string]bool{}
	for _, nb := range rep.Notebooks {
		a := nb.Activity
		computing := nb.Compute != nil && nb.Compute.State == attribution.ComputeComputing
		// Its server may say idle while its processes compute on a GPU:
		// in use, then.
		if a != nil && a.ExecutionState == "idle" && nb.GPUMemoryBytes > 0 && !computing && !seenIdle[nb.KernelID] {
			seenIdle[nb.KernelID] = true
			s.gauge(descIdleBytes, float64(nb.GPUMemoryBytes), nb.KernelID, nb.Notebook, nb.User)
			s.gauge(descIdleSeconds, a.IdleSeconds, nb.KernelID, nb.Notebook, nb.User)
		}
		// Set by the daemon's history only.
		if nb.PeakBytes > 0 && !seenPeak[nb.KernelID] {
			seenPeak[nb.KernelID] = true
			s.gauge(descNotebookPeak, float64(nb.PeakBytes), nb.KernelID, nb.Notebook, nb.User)
		}
	}
}

// collectDaemon sends the daemon's own series: its threshold, kernels
// attached, and its last sample and each of its steps (the first of a
// step named twice).
func collectDaemon(s *series, snap Snapshot, simulated bool) {
	s.gauge(descThreshold, max(snap.AlertThreshold, 0))
	s.gauge(descAttached, float64(snap.AttachedKernels))
	s.gauge(descSampleDuration, snap.SampleDuration.Seconds())
	s.gauge(descSampleSuccess, boolFloat(snap.SampleSuccess))
	if !snap.SampledAt.IsZero() {
		s.gauge(descSampleTime, float64(snap.SampledAt.UnixNano())/1e9)
	}
	s.gauge(descSimulated, boolFloat(simulated))
	for _, st := range snap.Steps { // the series dedupes a step's second entry
		s.gauge(descStepDuration, st.Duration.Seconds(), st.Step)
		s.gauge(descStepSuccess, boolFloat(st.Success), st.Step)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Metrics is the daemon's registry: the snapshot collector, the reclaim
// counters, and the Go and process collectors.
type Metrics struct {
	reg *prometheus.Registry
	src Source
	log zerolog.Logger
	// public, when set, is what a scrape without the bearer token gets
	// (see NotebooksOnlyWith).
	public         *prometheus.Registry
	token          string
	reclaimedBytes prometheus.Counter
	reclaimedProcs prometheus.Counter
	culled         *prometheus.CounterVec
	oom            oomCounters
	leftRunning    *prometheus.CounterVec
}

// Option changes what New's registry exports.
type Option func(*snapshotCollector)

// PerNotebook says whether to export gpumem_notebook_gpu_memory_bytes, the
// one family labelled by kernel_id and notebook (default true). Without it
// the per-user family still says who holds what.
func PerNotebook(on bool) Option {
	return func(c *snapshotCollector) { c.perNotebook = on }
}

// New registers a collector over src, the reclaim counters and the Go and
// process collectors in a new registry.
func New(src Source, log zerolog.Logger, opts ...Option) *Metrics {
	coll := snapshotCollector{src: src, perNotebook: true}
	for _, o := range opts {
		o(&coll)
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		src: src,
		log: log,
		reclaimedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpumem_reclaimed_bytes_total",
			Help: "GPU memory held by orphaned processes of restarted or shut-down kernels when the daemon ended them, in bytes.",
		}),
		reclaimedProcs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpumem_reclaimed_processes_total",
			Help: "Orphaned processes of restarted or shut-down kernels that the daemon ended.",
		}),
		culled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpumem_culled_kernels_total",
			Help: "Idle kernels holding GPU memory that GPU-aware culling acted on, by action (report, free, shutdown).",
		}, []string{"action"}),
		oom: newOOMCounters(coll.perNotebook),
		leftRunning: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpumem_reclaim_left_running_total",
			Help: "Processes of restarted or shut-down kernels that reclaim left running, by reason: computing (on a GPU) or unknown (its GPU utilization could not be judged).",
		}, []string{"reason"}),
	}
	// Both reasons from the start: an alert on increase() needs a series
	// before the first one.
	m.leftRunning.WithLabelValues(attribution.ComputeComputing)
	m.leftRunning.WithLabelValues(attribution.ComputeUnknown)
	m.reg.MustRegister(
		coll,
		podCollector{src: src, perNotebook: coll.perNotebook},
		computeCollector{src: src, perNotebook: coll.perNotebook},
		m.reclaimedBytes,
		m.reclaimedProcs,
		m.culled,
		m.oom.full(),
		m.leftRunning,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// AddReclaimed counts processes ended by the daemon and the GPU memory they held.
func (m *Metrics) AddReclaimed(processes int, bytes uint64) {
	if processes > 0 {
		m.reclaimedProcs.Add(float64(processes))
	}
	m.reclaimedBytes.Add(float64(bytes))
}

// AddLeftRunning counts a process reclaim left running; reason is
// attribution.ComputeComputing or attribution.ComputeUnknown.
func (m *Metrics) AddLeftRunning(reason string) { m.leftRunning.WithLabelValues(reason).Inc() }

// AddCulled counts one culling action.
func (m *Metrics) AddCulled(action string) { m.culled.WithLabelValues(action).Inc() }

// Registry is where the daemon may register collectors of its own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves GET /metrics (and HEAD); other methods get 405, other
// paths 404. It does not check Host: Listen's server does.
func (m *Metrics) Handler() http.Handler {
	opts := promhttp.HandlerOpts{
		ErrorLog: promLogger{m.log},
		// A broken family must not hide the others.
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.scrapeHandler(opts))
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, fmt.Sprintf("method %s not allowed: use GET", r.Method), http.StatusMethodNotAllowed)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not found: metrics are at /metrics", http.StatusNotFound)
	})
	return mux
}

// promLogger is promhttp's error log over zerolog.
type promLogger struct{ log zerolog.Logger }

func (l promLogger) Println(v ...any) {
	l.log.Error().Msg(fmt.Sprint(v...))
}
