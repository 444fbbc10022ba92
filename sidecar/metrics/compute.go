package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// GPU work: utilization per GPU, notebook and notebook process, the
// daemon's verdict on whether each notebook computes, and what notebooks
// and users held while computing nothing (hoarding). A figure the GPU
// cannot give (MIG, a driver without per-process utilization) has no
// series: it is unknown, never 0.
var (
	descGPUSM = prometheus.NewDesc("gpumem_gpu_sm_utilization_ratio",
		"Share of time a kernel ran on the GPU's SMs, summed over its processes (NVML's per-process utilization), 0 to 1; absent when the GPU cannot say.",
		[]string{"gpu"}, nil)
	descGPUMemUtil = prometheus.NewDesc("gpumem_gpu_memory_utilization_ratio",
		"Share of time the GPU's memory was read or written, summed over its processes, 0 to 1; absent when the GPU cannot say.",
		[]string{"gpu"}, nil)
	descNotebookSM = prometheus.NewDesc("gpumem_notebook_gpu_sm_utilization_ratio",
		"Share of time a kernel of the notebook's processes (children included) ran on the GPU's SMs, 0 to 1; absent when unknown.",
		notebookLabels, nil)
	descNotebookMemUtil = prometheus.NewDesc("gpumem_notebook_gpu_memory_utilization_ratio",
		"Share of time the GPU's memory was read or written for the notebook's processes, 0 to 1; absent when unknown.",
		notebookLabels, nil)
	descProcessSM = prometheus.NewDesc("gpumem_process_gpu_sm_utilization_ratio",
		"Share of time a kernel of one process of a notebook ran on the GPU's SMs, 0 to 1; absent when unknown.",
		[]string{"kernel_id", "notebook", "gpu", "user", "pid"}, nil)
	descComputing = prometheus.NewDesc("gpumem_notebook_gpu_computing",
		"1 when one of the notebook's processes computed on a GPU within gpumem serve's compute window, 0 when none did; absent when unknown.",
		idleLabels, nil)
	descNotebookHoard = prometheus.NewDesc("gpumem_notebook_hoarded_gpu_memory_byte_seconds",
		"GPU memory the notebook's kernel held while computing nothing, over the daemon's history window (24 h), in byte-seconds.",
		idleLabels, nil)
	descUserHoard = prometheus.NewDesc("gpumem_user_hoarded_gpu_memory_byte_seconds",
		"GPU memory a user's notebooks held while computing nothing, over the daemon's history window (24 h), in byte-seconds.",
		[]string{"user"}, nil)
)

type computeCollector struct {
	src         Source
	perNotebook bool
}

func (c computeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGPUSM, descGPUMemUtil, descUserHoard} {
		ch <- d
	}
	if c.perNotebook {
		for _, d := range []*prometheus.Desc{descNotebookSM, descNotebookMemUtil, descProcessSM, descComputing, descNotebookHoard} {
			ch <- d
		}
	}
}

// Collect sends through series: label values are users' and kernels' (a
// hostile notebook name costs its own sample only), and a label set sent
// twice (two kernels of one id and notebook) is sent once.
func (c computeCollector) Collect(ch chan<- prometheus.Metric) {
	rep := c.src.Snapshot().Report
	gauge := newSeries(ch).gauge
	ratio := func(pct uint32) float64 { return float64(pct) / 100 }
	seenGPU := map[int]bool{}
	for _, g := range rep.GPUs {
		if u := g.Utilization; u != nil && !seenGPU[g.Index] {
			seenGPU[g.Index] = true
			gauge(descGPUSM, ratio(u.SMPercent), strconv.Itoa(g.Index))
			gauge(descGPUMemUtil, ratio(u.MemoryPercent), strconv.Itoa(g.Index))
		}
	}
	seenUser := map[string]bool{}
	for _, h := range rep.Hoarding {
		if !seenUser[h.User] {
			seenUser[h.User] = true
			gauge(descUserHoard, h.GiBHours*(1<<30)*3600, h.User)
		}
	}
	if !c.perNotebook {
		return
	}
	for _, nb := range rep.Notebooks {
		for _, g := range nb.PerGPU {
			if u := g.Utilization; u != nil {
				gpu := strconv.Itoa(g.Index)
				gauge(descNotebookSM, ratio(u.SMPercent), nb.KernelID, nb.Notebook, gpu, nb.User)
				gauge(descNotebookMemUtil, ratio(u.MemoryPercent), nb.KernelID, nb.Notebook, gpu, nb.User)
			}
		}
		for _, p := range nb.Processes {
			for _, g := range p.PerGPU {
				if u := g.Utilization; u != nil {
					gauge(descProcessSM, ratio(u.SMPercent), nb.KernelID, nb.Notebook, strconv.Itoa(g.Index), nb.User, strconv.Itoa(p.PID))
				}
			}
		}
		if cp := nb.Compute; cp != nil {
			switch cp.State {
			case attribution.ComputeComputing:
				gauge(descComputing, 1, nb.KernelID, nb.Notebook, nb.User)
			case attribution.ComputeIdle:
				gauge(descComputing, 0, nb.KernelID, nb.Notebook, nb.User)
			}
			if cp.HoardedGiBHours != nil {
				gauge(descNotebookHoard, *cp.HoardedGiBHours*(1<<30)*3600, nb.KernelID, nb.Notebook, nb.User)
			}
		}
	}
}
