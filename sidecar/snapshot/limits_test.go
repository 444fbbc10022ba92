package snapshot

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/snapshot/snapshottest"
)

// str is a SHORT_BINUNICODE of s.
func str(s string) string { return "\x8c" + string([]byte{byte(len(s))}) + s }

// TestLimits: each bound trips on the pickle made to pass it, with an
// error that says which, before the reader holds much: what the reading
// allocates in all stays within a few times Limits.Bytes.
func TestLimits(t *testing.T) {
	small := Limits{Bytes: 8 << 20, Stack: 1 << 12, Depth: 16, MemoSlots: 1 << 10, WorkPerByte: 16, WorkBase: 1 << 16, CheckEvery: 256}
	snap := func(body string) []byte { // {"segments": [], "device_traces": [L]}, L's items from body
		return []byte("\x80\x04}(" + str("segments") + "]" + str("device_traces") + "](]" + body + "eu.")
	}
	manyDevices := "0" // pop the list L: the traces are the lists below
	for i := 0; i < MaxDevices+1; i++ {
		manyDevices += "]"
	}
	manyDevices += "]"
	cases := []struct {
		name string
		raw  []byte
		is   error
		has  string
	}{
		{"a memo index past the memo (9 bytes)", snapshottest.MemoIndexBomb(), nil, "stored when only 0 were"},
		{"more memo slots than the bound", []byte("\x80\x04N" + strings.Repeat("\x94", 2000) + "."), ErrLimit, "memo slots"},
		{"a stack of DUPs", snapshottest.DupBomb(1 << 16), ErrLimit, "values on the stack"},
		{"nested marks", []byte("\x80\x04" + strings.Repeat("(", 100)), ErrLimit, "nested marks"},
		{"a string past maxString", []byte("\x80\x04X\x00\x00\x00\x10"), ErrLimit, "a string of"},
		{"a string longer than the file", []byte("\x80\x04X\x00\x00\x08\x00abc"), nil, "truncated"},
		{"strings past the memory bound", []byte("\x80\x04(" + strings.Repeat("X\x00\x00\x01\x00"+strings.Repeat("a", 1<<16), 200)), ErrLimit, "memory bound"},
		{"a list past the memory bound", snapshottest.SlotBomb(1000), ErrLimit, "memory bound"},
		{"empty dicts past the memory bound", []byte("\x80\x04]" + strings.Repeat("("+strings.Repeat("}", 4000)+"e", 200)), ErrLimit, "memory bound"},
		{"a huge LONG4", []byte("\x80\x04\x8b\x00\x00\x01\x00"), ErrLimit, "an integer of"},
		{"more devices than MaxDevices", snap(manyDevices), ErrLimit, "devices"},
		{"a segment revisited through the memo", snapshottest.SegmentBomb(20000, 100000), ErrLimit, "CPU bound"},
		{"the CPU bomb: an entry revisited through the memo", snapshottest.CPUBomb(100000, 1000000, 0), nil, "APPEND of a dict the reader already consumed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, err := Reduce(context.Background(), bytes.NewReader(c.raw), small)
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatal("no error")
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v is not %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.has) {
				t.Errorf("error %q lacks %q", err, c.has)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(8*small.Bytes)+4*uint64(len(c.raw)) {
				t.Errorf("%d bytes of pickle allocated %d MiB", len(c.raw), alloc>>20)
			}
			// The CPU bound is the reader's step count, not time: this only
			// catches a bomb that escapes it (the review's ran for minutes),
			// with room for the race detector on a loaded 2-core box (6.5 s
			// was seen there for the 60 MB list).
			if took > time.Minute {
				t.Errorf("took %v", took)
			}
		})
	}
}

// TestReduceStopsOnCancel: a reduction in progress ends soon after its
// context does.
func TestReduceStopsOnCancel(t *testing.T) {
	var raw bytes.Buffer
	if err := snapshottest.WriteLarge(&raw, 1_000_000); err != nil {
		t.Fatal(err)
	}
	red, err := Reduce(context.Background(), bytes.NewReader(raw.Bytes()), DefaultLimits)
	if err != nil || red.Devices[0].Entries != 1_000_000 {
		t.Fatalf("the large snapshot: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Reduce(ctx, bytes.NewReader(raw.Bytes()), DefaultLimits)
		done <- err
	}()
	time.Sleep(time.Millisecond) // let it start; the check below does not depend on it
	cancel()
	at := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled reduction: %v", err)
		}
		// Checked every 4,096 opcodes or steps: milliseconds, and under
		// the race detector on a loaded box well under 2 s.
		if took := time.Since(at); took > 2*time.Second {
			t.Errorf("stopped %v after its context ended", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reduction went on 10 s after its context ended")
	}
}

// TestReductionBounded: distinct actions past MaxActions count as
// "other"; names are clipped to MaxString.
func TestReductionBounded(t *testing.T) {
	var body strings.Builder
	body.WriteString("(")
	for i := 0; i < 100; i++ {
		body.WriteString("}(" + str("action") + str(strings.Repeat("a", i+1)) + "u")
	}
	body.WriteString("e")
	raw := []byte("\x80\x04}(" + str("segments") + "]" + str("device_traces") + "](]" + body.String() + "eu.")
	red, err := Reduce(context.Background(), bytes.NewReader(raw), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if a := red.Devices[0].Actions; len(a) != MaxActions+1 || a["other"] != 100-MaxActions {
		t.Errorf("%d actions, %d other", len(a), a["other"])
	}
	if got := clip(strings.Repeat("é", MaxString)); len(got) > MaxString+len("…") || !strings.HasSuffix(got, "é…") {
		t.Errorf("clip: %d bytes, ends %q", len(got), got[len(got)-8:])
	}
}
