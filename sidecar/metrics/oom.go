package metrics

import "github.com/prometheus/client_golang/prometheus"

// newOOMCounter is gpumem_oom_total: out-of-memory errors the daemon
// recorded, by notebook (unless the per-notebook series are off), user and
// GPU. A counter's series outlive their kernel, as counters should.
func newOOMCounter(perNotebook bool) *prometheus.CounterVec {
	labels := []string{"notebook", "user", "gpu"}
	if !perNotebook {
		labels = []string{"user", "gpu"}
	}
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpumem_oom_total",
		Help: "GPU out-of-memory errors raised in notebook kernels, as the kernels reported them to the daemon.",
	}, labels)
}

// AddOOM counts one out-of-memory error; gpu is the GPU's index, or
// "unknown".
func (m *Metrics) AddOOM(notebook, user, gpu string) {
	if m.oomPerNotebook {
		m.oom.WithLabelValues(notebook, user, gpu).Inc()
		return
	}
	m.oom.WithLabelValues(user, gpu).Inc()
}
