package daemon

import (
	"context"
	"fmt"
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
	got, _ := d.recordHistory(at, &rep)
	if got != 1000 {
		t.Fatalf("recordHistory returned %d, want 1000", got)
	}
	rep.Notebooks[0].GPUMemoryBytes = 3
	if _, peaks := d.recordHistory(at.Add(time.Second), &rep); peaks[""] != 5 {
		t.Fatalf("peak = %d, want 5", peaks[""])
	}
	// A restart (new kernel pid) starts the peak again.
	rep.Notebooks[0].PIDs = []int{11}
	_, peaks := d.recordHistory(at.Add(2*time.Second), &rep)
	if peaks[""] != 3 {
		t.Fatalf("peak after a restart = %d, want 3", peaks[""])
	}
	// Finish writes them into the report.
	attribution.Finish(&rep, attribution.FinishInput{Peaks: peaks})
	if rep.Notebooks[0].PeakBytes != 3 {
		t.Fatalf("finished peak = %d, want 3", rep.Notebooks[0].PeakBytes)
	}
}

// A notebook on two GPUs has a series on each with its bytes there, beside
// its total: a GPU's plot never draws the notebook's whole figure. Its SM
// utilization is a series apart, by the same identity; a notebook whose
// utilization is unknown has none.
func TestHistoryPerGPUSeries(t *testing.T) {
	d := &Daemon{hist: newHistoryParts(time.Second)}
	rep := attribution.Report{
		GPUs: []attribution.GPU{{Index: 0, MemoryUsedBytes: 20}, {Index: 1, MemoryUsedBytes: 41}},
		Notebooks: []attribution.Notebook{
			{KernelID: "two", ConnectionFile: "/run/kernel-two.json", PIDs: []int{10}, GPUMemoryBytes: 61,
				PerGPU:      []attribution.GPUBytes{{Index: 0, Bytes: 20}, {Index: 1, Bytes: 41}},
				Utilization: &attribution.Utilization{SMPercent: 130}},
			{KernelID: "cpu", ConnectionFile: "/run/kernel-cpu.json", PIDs: []int{11}},
		},
	}
	at := time.Unix(1000, 0)
	d.recordHistory(at, &rep)
	gpus, notebooks, sm, step := historySeries(d.hist.store.Since(at, 1000))
	if step != 1 || len(gpus) != 2 {
		t.Fatalf("step %d, %d GPU series; want 1 and 2", step, len(gpus))
	}
	got := map[string]uint64{}
	for _, s := range notebooks {
		key := s.ID
		if s.GPU != nil {
			key += fmt.Sprintf("@%d", *s.GPU)
		}
		if len(s.Points) != 1 {
			t.Fatalf("series %s: %d points, want 1", key, len(s.Points))
		}
		got[key] = s.Points[0][1]
	}
	want := map[string]uint64{"two": 61, "two@0": 20, "two@1": 41, "cpu": 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("notebook series = %v, want %v", got, want)
	}
	if len(sm) != 1 || sm[0].ID != "two" || sm[0].ConnectionFile != "/run/kernel-two.json" || sm[0].GPU != nil ||
		len(sm[0].Points) != 1 || sm[0].Points[0][1] != 130 {
		t.Fatalf("SM series = %+v, want one of kernel two (its file, no GPU) at 130", sm)
	}
}
