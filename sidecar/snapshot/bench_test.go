package snapshot

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/nlpodyssey/gopickle/pickle"

	"github.com/gpumem/gpumem/internal/testenv"
)

// synth900k is scripts/synth_snapshot.py's 900,000-entry snapshot, made
// once per machine (it takes seconds) in the temporary directory.
func synth900k(b *testing.B) string {
	b.Helper()
	path := filepath.Join(os.TempDir(), "gpumem-synth-snapshot-900k-v1.pickle")
	if fi, err := os.Stat(path); err == nil && fi.Size() > 100<<20 {
		return path
	}
	tmp := path + ".tmp"
	cmd := exec.Command(testenv.Python(), filepath.Join(testenv.RepoRoot(), "scripts", "synth_snapshot.py"), tmp, "900000")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("synth_snapshot.py: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, path); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkReduce900k: the reduction of a synthetic snapshot of 900,000
// trace entries (about 120 MB of pickle); budget: at most 3 s and 5 MB of
// JSON. Reported: the JSON's size and the heap in use at the end.
func BenchmarkReduce900k(b *testing.B) {
	path := synth900k(b)
	b.ResetTimer()
	var out int
	var peak int64
	for i := 0; i < b.N; i++ {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		red, err := Reduce(context.Background(), f, DefaultLimits)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		body, _ := json.Marshal(red)
		out, peak = len(body), red.PeakBytes
	}
	b.StopTimer()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(out)/1e6, "MB-json")
	b.ReportMetric(float64(peak)/(1<<20), "MiB-estimated-peak")
	b.ReportMetric(float64(ms.HeapSys)/(1<<20), "MiB-heap-sys")
}

// BenchmarkGopickleLoad900k: the same file decoded whole by gopickle, the
// general library the reader was measured against (the reference of
// BenchmarkReduce900k in BENCHMARKS.md).
func BenchmarkGopickleLoad900k(b *testing.B) {
	path := synth900k(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		u := pickle.NewUnpickler(bufio.NewReaderSize(f, 1<<20))
		if _, err := u.Load(); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	b.StopTimer()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapSys)/(1<<20), "MiB-heap-sys")
}
