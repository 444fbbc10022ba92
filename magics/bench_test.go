package magics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
)

// The benchmarks run against a real kernel; see docs/benchmarks/magics.txt for the
// numbers and the command. Budgets: %gpumem and %gpumem vars in a
// kernel with 10,000 user variables < 100 ms; %gpumem free's overhead over
// gc.collect() + empty_cache() < 50 ms; attach + inject < 200 ms.

// tenKVars makes 10,000 user variables: 7,000 ints, 1,000 strings, 1,000
// tensors, 500 lists holding a tensor, 500 objects holding a tensor.
const tenKVars = `import torch, gc
_g = globals()
for _i in range(7000): _g['v%d' % _i] = _i
for _i in range(1000): _g['s%d' % _i] = 'x' * 10
for _i in range(1000): _g['t%d' % _i] = torch.zeros(10)
for _i in range(500): _g['l%d' % _i] = [torch.zeros(2), 1, 'a']
class O: pass
for _i in range(500):
    _o = O(); _o.w = torch.zeros(3); _g['o%d' % _i] = _o
del _g, _i, _o
print(len([k for k in globals() if not k.startswith('_')]))`

func benchKernel(b *testing.B) (*session, *protocol.Client) {
	b.Helper()
	testenv.Require(b, "torch")
	s := newSession(b)
	s.cell(tenKVars, true)
	c := dial(b, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := magics.Inject(ctx, c, magics.InjectOptions{}); err != nil {
		b.Fatal(err)
	}
	return s, c
}

// runMagic executes a %gpumem line as a visible (non-silent) request, as a
// notebook cell would, without storing history.
func runMagic(b *testing.B, c *protocol.Client, line string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := c.Execute(ctx, line, protocol.ExecuteOptions{NotSilent: true})
	if err != nil || r.Status != "ok" {
		b.Fatalf("%s: %v %+v", line, err, r)
	}
}

// BenchmarkMagic10kVars: round trip of each magic through gpumem's protocol
// client in a kernel with 10,000 user variables.
func BenchmarkMagic10kVars(b *testing.B) {
	_, c := benchKernel(b)
	for _, line := range []string{"%gpumem", "%gpumem vars", "%gpumem vars --all-devices", "%gpumem free --dry-run --all"} {
		b.Run(strings.ReplaceAll(strings.TrimPrefix(line, "%gpumem"), " ", "_"), func(b *testing.B) {
			runMagic(b, c, line) // warm the type cache
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				runMagic(b, c, line)
			}
		})
	}
}

// BenchmarkFreeOverhead: %gpumem free's cost beyond gc.collect() and
// emptying the caches, in a kernel with 10,000 variables, measured inside
// the kernel by free itself (overhead_ms = its total minus the time of its
// own gc.collect() + empty_cache()), for a cache-only free and for freeing
// a named tensor that was displayed (so Out, _ and _N hold it), and for
// --all (every variable scanned; on a CPU host none is freed). It also
// reports gc.collect() + empty_cache() alone.
func BenchmarkFreeOverhead(b *testing.B) {
	_, c := benchKernel(b)
	eval := func(expr string) map[string]float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		r, err := c.Execute(ctx, "pass", protocol.ExecuteOptions{UserExpressions: map[string]string{"t": expr}})
		if err != nil || r.Status != "ok" || r.UserExpressions["t"].Status != "ok" {
			b.Fatalf("%s: %v %+v", expr, err, r)
		}
		var s string
		if err := jsonUnmarshal(r.UserExpressions["t"].Data["text/plain"], &s); err != nil {
			b.Fatal(err)
		}
		var m map[string]float64
		if err := jsonUnmarshal([]byte(strings.Trim(s, "'")), &m); err != nil {
			b.Fatalf("%s: %v", s, err)
		}
		return m
	}
	const baseline = `__import__('json').dumps({'ms': (lambda t: (gc.collect(), torch.cuda.empty_cache(), (__import__('time').perf_counter() - t) * 1000)[2])(__import__('time').perf_counter())})`
	const cacheOnly = `__import__('json').dumps({k: v for k, v in __import__('sys').modules['_gpumem_magics'].freeing.free_data().items() if k in ('overhead_ms', 'caches_ms')})`
	const named = `(get_ipython().user_ns.__setitem__('tx', torch.zeros(1000)), get_ipython().displayhook.update_user_ns(get_ipython().user_ns['tx']), __import__('json').dumps({k: v for k, v in __import__('sys').modules['_gpumem_magics'].freeing.free_data(['tx']).items() if k in ('overhead_ms', 'caches_ms')}))[2]`
	const all = `__import__('json').dumps({k: v for k, v in __import__('sys').modules['_gpumem_magics'].freeing.free_data(all_=True).items() if k in ('overhead_ms', 'caches_ms')})`
	var base, cacheOver, namedOver, namedCaches, allOver float64
	for i := 0; i < b.N; i++ {
		base += eval(baseline)["ms"]
		cacheOver += eval(cacheOnly)["overhead_ms"]
		m := eval(named)
		namedOver += m["overhead_ms"]
		namedCaches += m["caches_ms"]
		allOver += eval(all)["overhead_ms"]
	}
	n := float64(b.N)
	b.ReportMetric(base/n, "ms-gc+empty_cache")
	b.ReportMetric(namedCaches/n, "ms-free-own-gc+caches")
	b.ReportMetric(cacheOver/n, "ms-overhead-cache-only")
	b.ReportMetric(namedOver/n, "ms-overhead-free-name")
	b.ReportMetric(allOver/n, "ms-overhead-free-all")
}

// BenchmarkAttachInject: protocol.Dial + Inject + Close, the round trip of
// `gpumem attach` (kernel_info, then the silent execute).
func BenchmarkAttachInject(b *testing.B) {
	s := newSession(b)
	s.cell("x = 1", true)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		c, err := protocol.Dial(ctx, s.k.ConnectionFile, protocol.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := magics.Inject(ctx, c, magics.InjectOptions{}); err != nil {
			b.Fatal(err)
		}
		_ = c.Close()
		cancel()
	}
}

// BenchmarkInject: Inject alone over an attached client.
func BenchmarkInject(b *testing.B) {
	s := newSession(b)
	c := dial(b, s)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if _, err := magics.Inject(ctx, c, magics.InjectOptions{}); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}
