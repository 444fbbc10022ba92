package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem/internal/textsafe"
)

// series sends one scrape's const metrics. Label values come from users
// and kernels (notebook paths, kernel ids from file names, user and pod
// names), so none may fail anything beyond its own sample: each value is
// made safe (textsafe.Label: valid UTF-8, which client_golang requires,
// no control characters, bounded), a label set already sent for a desc is
// not sent again (two samples with one label set fail their whole family),
// and a metric client_golang still refuses goes as an invalid metric,
// which costs that sample only, never a panic that ends the collector and
// every series after it.
type series struct {
	ch   chan<- prometheus.Metric
	seen map[*prometheus.Desc]map[string]bool
}

func newSeries(ch chan<- prometheus.Metric) *series {
	return &series{ch: ch, seen: map[*prometheus.Desc]map[string]bool{}}
}

// labels makes each value safe, in place, and returns the values.
func safeLabels(values []string) []string {
	for i, v := range values {
		values[i] = textsafe.Label(v)
	}
	return values
}

// gauge sends one gauge sample of d; a label set already sent is skipped.
func (s *series) gauge(d *prometheus.Desc, v float64, labelValues ...string) {
	values := safeLabels(append([]string(nil), labelValues...))
	// Safe values are valid UTF-8, in which 0xff never occurs.
	key := strings.Join(values, "\xff")
	seen := s.seen[d]
	if seen == nil {
		seen = map[string]bool{}
		s.seen[d] = seen
	}
	if seen[key] {
		return
	}
	seen[key] = true
	m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, values...)
	if err != nil {
		m = prometheus.NewInvalidMetric(d, err)
	}
	s.ch <- m
}
