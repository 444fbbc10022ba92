package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// On Kubernetes every GPU byte also belongs to a pod. podCollector gives
// one series per (pod, container, notebook, GPU) so that a query can sum
// by pod, namespace or JupyterHub user without joining: a notebook's bytes
// carry its path, a pod's other processes carry notebook="". Off
// Kubernetes (no process has a pod) it gives nothing. Without perNotebook
// (PerNotebook(false), for fleets that keep per-kernel series out of
// Prometheus) kernel_id and notebook stay empty and a pod's notebooks sum
// into one series per container and GPU.
var descPod = prometheus.NewDesc("gpumem_pod_gpu_memory_bytes",
	"GPU memory held by the processes of a Kubernetes pod, in bytes, by container and notebook (notebook is empty for processes of no kernel); user is the JupyterHub user from the pod's labels.",
	[]string{"namespace", "pod", "container", "user", "notebook", "kernel_id", "gpu"}, nil)

type podCollector struct {
	src         Source
	perNotebook bool
}

func (c podCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descPod }

func (c podCollector) Collect(ch chan<- prometheus.Metric) {
	rep := c.src.Snapshot().Report
	type key struct {
		namespace, pod, container, user, notebook, kernelID string
		gpu                                                 int
	}
	var order []key
	sums := map[key]uint64{}
	add := func(k key, b uint64) {
		// Keyed as shown: two names that show alike sum into one series.
		l := safeLabels([]string{k.namespace, k.pod, k.container, k.user, k.notebook, k.kernelID})
		k.namespace, k.pod, k.container, k.user, k.notebook, k.kernelID = l[0], l[1], l[2], l[3], l[4], l[5]
		if _, ok := sums[k]; !ok {
			order = append(order, k)
		}
		sums[k] += b
	}
	for _, nb := range rep.Notebooks {
		if nb.Pod == nil {
			continue
		}
		for _, g := range nb.PerGPU {
			k := key{nb.Pod.Namespace, nb.Pod.Name, nb.Pod.Container, nb.Pod.User, "", "", g.Index}
			if c.perNotebook {
				k.notebook, k.kernelID = nb.Notebook, nb.KernelID
			}
			add(k, g.Bytes)
		}
	}
	for _, p := range rep.Other {
		if p.Pod == nil {
			continue
		}
		for _, g := range p.PerGPU {
			add(key{p.Pod.Namespace, p.Pod.Name, p.Pod.Container, p.Pod.User, "", "", g.Index}, g.Bytes)
		}
	}
	gauge := newSeries(ch).gauge
	for _, k := range order {
		gauge(descPod, float64(sums[k]), k.namespace, k.pod, k.container, k.user, k.notebook, k.kernelID, strconv.Itoa(k.gpu))
	}
}
