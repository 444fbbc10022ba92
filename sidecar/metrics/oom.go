package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem/internal/textsafe"
)

// oomCounters are gpumem_oom_total: out-of-memory errors the daemon
// recorded, by notebook, user and GPU where a scrape may see notebooks,
// by user and GPU only elsewhere (PerNotebook(false), and a scrape without
// the token of NotebooksOnlyWith, which gets the public registry). Both
// count every error, so each registry shows the whole count. A counter's
// series outlive their kernel, as counters should.
type oomCounters struct {
	byNotebook *prometheus.CounterVec // nil when no registry shows notebooks
	byUser     *prometheus.CounterVec
}

func newOOMCounters(perNotebook bool) oomCounters {
	opts := prometheus.CounterOpts{
		Name: "gpumem_oom_total",
		Help: "GPU out-of-memory errors raised in notebook kernels, as the kernels reported them to the daemon.",
	}
	c := oomCounters{byUser: prometheus.NewCounterVec(opts, []string{"user", "gpu"})}
	if perNotebook {
		c.byNotebook = prometheus.NewCounterVec(opts, []string{"notebook", "user", "gpu"})
	}
	return c
}

// full is the family of the registry that may show notebooks.
func (c oomCounters) full() prometheus.Collector {
	if c.byNotebook != nil {
		return c.byNotebook
	}
	return c.byUser
}

// AddOOM counts one out-of-memory error; gpu is the GPU's index, or
// "unknown". Label values come from users and kernels: made safe as every
// series' are (textsafe.Label), since client_golang panics on invalid
// UTF-8 in a counter's labels.
func (m *Metrics) AddOOM(notebook, user, gpu string) {
	user, gpu = textsafe.Label(user), textsafe.Label(gpu)
	if m.oom.byNotebook != nil {
		m.oom.byNotebook.WithLabelValues(textsafe.Label(notebook), user, gpu).Inc()
	}
	m.oom.byUser.WithLabelValues(user, gpu).Inc()
}
