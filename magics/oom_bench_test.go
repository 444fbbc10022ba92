package magics_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
)

// oomCost measures, inside the kernel, what the out-of-memory report's
// post_run_cell hook costs a cell that does not fail: the hook called
// alone, and IPython's post_run_cell trigger with and without it (what a
// cell pays), in microseconds per cell, best of 5 runs of 100,000.
const oomCost = `(lambda ip, m, ti: __import__("json").dumps((lambda r: {
  "hook_us": min(ti.repeat(lambda: m.oom.oom_hook(r), number=100000, repeat=5)) * 10,
  "with_us": min(ti.repeat(lambda: ip.events.trigger("post_run_cell", r), number=100000, repeat=5)) * 10,
  "without_us": (ip.events.unregister("post_run_cell", m.oom.oom_hook),
                 min(ti.repeat(lambda: ip.events.trigger("post_run_cell", r), number=100000, repeat=5)) * 10,
                 ip.events.register("post_run_cell", m.oom.oom_hook))[1],
})(__import__("IPython").core.interactiveshell.ExecutionResult(None))))(get_ipython(), __import__("sys").modules["_gpumem_magics"], __import__("timeit"))`

// BenchmarkOOMHookPerCell: the out-of-memory report's cost to a cell that
// does not fail (budget: under 20 µs). See BENCHMARKS.md.
func BenchmarkOOMHookPerCell(b *testing.B) {
	s := newSession(b)
	c := dial(b, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := magics.Inject(ctx, c, magics.InjectOptions{}); err != nil {
		b.Fatal(err)
	}
	var hook, with, without float64
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		r, err := c.Execute(ctx, "pass", protocol.ExecuteOptions{UserExpressions: map[string]string{"t": oomCost}})
		cancel()
		if err != nil || r.Status != "ok" || r.UserExpressions["t"].Status != "ok" {
			b.Fatalf("%v %+v", err, r)
		}
		var str string
		if err := json.Unmarshal(r.UserExpressions["t"].Data["text/plain"], &str); err != nil {
			b.Fatal(err)
		}
		var m map[string]float64
		if err := json.Unmarshal([]byte(strings.Trim(str, "'")), &m); err != nil {
			b.Fatalf("%s: %v", str, err)
		}
		hook += m["hook_us"]
		with += m["with_us"]
		without += m["without_us"]
	}
	n := float64(b.N)
	b.ReportMetric(hook/n, "µs-hook")
	b.ReportMetric(with/n, "µs-trigger-with-hook")
	b.ReportMetric(without/n, "µs-trigger-without")
	b.ReportMetric((with-without)/n, "µs-per-cell")
}
