package protocol

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// reportPercentiles adds p50 and p99 of d (in ms) to the benchmark's output.
func reportPercentiles(b *testing.B, prefix string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	at := func(p float64) float64 {
		i := min(int(p*float64(len(d))), len(d)-1)
		return float64(d[i].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.50), prefix+"p50-ms")
	b.ReportMetric(at(0.99), prefix+"p99-ms")
}

// BenchmarkAttach: Dial (read the connection file, connect four sockets,
// kernel_info on control) against a live kernel. Close is not timed.
func BenchmarkAttach(b *testing.B) {
	k := testenv.StartKernel(b, b.TempDir())
	attach(b, k.ConnectionFile, Options{}).Close() // wait until the kernel is up
	var d []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := Dial(ctx, k.ConnectionFile, Options{})
		elapsed := time.Since(start)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		d = append(d, elapsed)
		c.Close()
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, "attach-", d)
}

// BenchmarkExecuteRoundTrip: a silent execute of `pass`. kernel- is the kernel's own time (reply header.date
// minus metadata.started); overhead- is the round trip minus that.
func BenchmarkExecuteRoundTrip(b *testing.B) {
	k := testenv.StartKernel(b, b.TempDir())
	c := attach(b, k.ConnectionFile, Options{})
	for _, bc := range []struct {
		name string
		opts ExecuteOptions
	}{{"raw", ExecuteOptions{}}} {
		b.Run(bc.name, func(b *testing.B) {
			var rt, kernel, overhead []time.Duration
			for range b.N {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				r, err := c.Execute(ctx, "pass", bc.opts)
				elapsed := time.Since(start)
				cancel()
				if err != nil || r.Status != "ok" {
					b.Fatalf("%+v, %v", r, err)
				}
				rt = append(rt, elapsed)
				kernel = append(kernel, r.KernelTime)
				overhead = append(overhead, elapsed-r.KernelTime)
			}
			b.StopTimer()
			reportPercentiles(b, "rt-", rt)
			reportPercentiles(b, "kernel-", kernel)
			reportPercentiles(b, "overhead-", overhead)
		})
	}
}

// BenchmarkKernelInfoRoundTrip: kernel_info on control on an attached client.
func BenchmarkKernelInfoRoundTrip(b *testing.B) {
	k := testenv.StartKernel(b, b.TempDir())
	c := attach(b, k.ConnectionFile, Options{})
	var d []time.Duration
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		_, err := c.KernelInfo(ctx)
		d = append(d, time.Since(start))
		cancel()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportPercentiles(b, "rt-", d)
}

func BenchmarkEncodeDecode(b *testing.B) {
	key := []byte("a0436f6c-1916-498b-8eb9-e81ab9368e84")
	m := testMessage()
	m.Content = json.RawMessage(`{"code":"pass","silent":true,"store_history":false,"user_expressions":{},"allow_stdin":false,"stop_on_error":false}`)
	b.ReportAllocs()
	for range b.N {
		frames, err := Encode(m, key)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Decode(frames, key, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}
