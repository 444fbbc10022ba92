package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

func TestWaitSample(t *testing.T) {
	h := newHistoryParts(time.Second)
	h.recorded(100)

	// A sample as new as asked: no wait.
	start := time.Now()
	h.waitSample(t.Context(), 100, time.Minute)
	if time.Since(start) > time.Second {
		t.Fatalf("waitSample for a recorded second waited %v", time.Since(start))
	}

	// Newer than any: wakes on the next sample.
	done := make(chan struct{})
	go func() { defer close(done); h.waitSample(t.Context(), 101, time.Minute) }()
	h.recorded(100) // same second again: keeps waiting
	select {
	case <-done:
		t.Fatal("waitSample returned for a sample older than asked")
	case <-time.After(50 * time.Millisecond):
	}
	h.recorded(101)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("waitSample did not return after the sample it waited for")
	}

	// Bounded by the limit, and by ctx.
	start = time.Now()
	h.waitSample(t.Context(), 500, 20*time.Millisecond)
	if el := time.Since(start); el < 20*time.Millisecond || el > 5*time.Second {
		t.Fatalf("waitSample with a 20ms limit took %v", el)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	h.waitSample(ctx, 500, time.Minute)
}

func TestRecordHistoryPeaks(t *testing.T) {
	d := &Daemon{hist: newHistoryParts(time.Second)}
	rep := attribution.Report{
		GPUs:      []attribution.GPU{{Index: 0, MemoryUsedBytes: 9}},
		Notebooks: []attribution.Notebook{{KernelID: "k", PIDs: []int{10}, GPUMemoryBytes: 5}},
	}
	at := time.Unix(1000, 0)
	if got := d.recordHistory(at, &rep); got != 1000 {
		t.Fatalf("recordHistory returned %d, want 1000", got)
	}
	rep.Notebooks[0].GPUMemoryBytes = 3
	d.recordHistory(at.Add(time.Second), &rep)
	if rep.Notebooks[0].PeakBytes != 5 {
		t.Fatalf("peak = %d, want 5", rep.Notebooks[0].PeakBytes)
	}
	// A restart (new kernel pid) starts the peak again.
	rep.Notebooks[0].PIDs = []int{11}
	d.recordHistory(at.Add(2*time.Second), &rep)
	if rep.Notebooks[0].PeakBytes != 3 {
		t.Fatalf("peak after a restart = %d, want 3", rep.Notebooks[0].PeakBytes)
	}
}
