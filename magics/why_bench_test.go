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

// A million live objects tracked by gc (330,000 instances, lists and
// dicts each) besides the kernel's own, and the holders of
// TestWhySevenHolders but the traceback; "frozen" freezes all of it first,
// as vLLM does at start-up.
const millionObjects = `class _O(object):
    pass
_heap = []
for _i in range(330000):
    _o = _O(); _o.a = _i
    _heap.append(_o); _heap.append([_i, "x"]); _heap.append({"k": _i})
del _o, _i
import gc as _gc
print(len(_gc.get_objects()) + _gc.get_freeze_count())`

// gcPass is the reference: one pass of Python over gc's objects, the floor
// of any search of the heap (what vars' and why's first step cost).
const gcPass = `__import__('json').dumps((lambda time, gc: (lambda t: (sum(1 for o in gc.get_objects() if type(o) is int), ` +
	`gc.get_freeze_count(), (time.perf_counter() - t) * 1000)[2])(time.perf_counter()))(__import__('time'), __import__('gc')))`

// BenchmarkWhyMillionObjects: %gpumem why --all-devices (the seven holders'
// search, a 2 s budget) in a real kernel holding 10^6 objects, as the
// kernel times it (why_ms; stopped = 1 when it ran out of budget and said
// so), beside one plain pass over gc's objects (gc_pass_ms) measured in the
// same kernel. Figures: BENCHMARKS.md.
func BenchmarkWhyMillionObjects(b *testing.B) {
	for _, freeze := range []bool{false, true} {
		name := "live"
		if freeze {
			name = "frozen"
		}
		b.Run(name, func(b *testing.B) {
			s, c := benchKernel(b)
			s.cell(millionObjects, true)
			plant := strings.Replace(sevenHolders, "gc.freeze()", "", 1)
			if freeze {
				plant += "\ngc.freeze()"
			}
			s.cell(plant, true)
			eval := func(expr string) float64 {
				ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
				defer cancel()
				r, err := c.Execute(ctx, "pass", protocol.ExecuteOptions{UserExpressions: map[string]string{"t": expr}})
				if err != nil || r.Status != "ok" || r.UserExpressions["t"].Status != "ok" {
					b.Fatalf("%s: %v %+v", expr, err, r)
				}
				var s string
				if err := json.Unmarshal(r.UserExpressions["t"].Data["text/plain"], &s); err != nil {
					b.Fatal(err)
				}
				var ms float64
				if err := json.Unmarshal([]byte(strings.Trim(s, "'")), &ms); err != nil {
					b.Fatalf("%s: %v", s, err)
				}
				return ms
			}
			var whyMS, refMS, stopped float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
				raw, err := magics.Why(ctx, c, magics.WhyOptions{AllDevices: true, Budget: 2})
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				var d whyData
				if err := json.Unmarshal(raw, &d); err != nil || d.Kind != "why" {
					b.Fatalf("why: %v %s", err, raw)
				}
				whyMS += float64(d.Elapsed)
				if d.Stopped != nil {
					stopped++
				}
				b.StopTimer()
				refMS += eval(gcPass)
				b.StartTimer()
			}
			n := float64(b.N)
			b.ReportMetric(whyMS/n, "why_ms")
			b.ReportMetric(refMS/n, "gc_pass_ms")
			b.ReportMetric(whyMS/refMS, "ratio")
			b.ReportMetric(stopped/n, "stopped")
		})
	}
}
