package snapshot

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/snapshot/snapshottest"
)

// fuzzLimits are small limits, so that the fuzzer meets them often.
var fuzzLimits = Limits{Bytes: 4 << 20, Stack: 1 << 14, Depth: 32, MemoSlots: 1 << 12,
	WorkPerByte: 16, WorkBase: 1 << 16, CheckEvery: 256}

// FuzzDecode: no input makes the reader panic, take long, or allocate
// more than its memory bound allows (what it allocates in all, garbage
// included, stays within a few times Limits.Bytes plus a little per byte
// of input); the corpus in testdata/fuzz/FuzzDecode keeps the inputs
// that reached new code, the bombs among them.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("\x80\x04}\x94(\x8c\x08segments\x94]\x94u."))
	f.Add([]byte("\x80\x02]q\x00(K\x01K\x02e."))
	f.Add([]byte("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}(h\x00h\x00s."))
	for _, b := range [][]byte{snapshottest.MemoIndexBomb(), snapshottest.DupBomb(1 << 12), snapshottest.CPUBomb(64, 256, 0)} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		_, _ = Reduce(context.Background(), bytes.NewReader(raw), fuzzLimits)
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		if alloc, bound := after.TotalAlloc-before.TotalAlloc, uint64(8*fuzzLimits.Bytes)+1024*uint64(len(raw)); alloc > bound {
			t.Errorf("%d bytes of pickle allocated %d bytes (bound %d)", len(raw), alloc, bound)
		}
		// A bomb the step count misses runs for minutes; a loaded 2-core
		// box under the race detector takes seconds for a large input.
		if took > 30*time.Second {
			t.Errorf("%d bytes of pickle took %v", len(raw), took)
		}
	})
}
