package daemon

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/metrics"
	"github.com/gpumem/gpumem/sidecar/oom"
)

func TestOOMLogAllowAndAnnotate(t *testing.T) {
	l := newOOMLog()
	now := time.Unix(1000, 0)
	for i := 0; i < oomBurst; i++ {
		if !l.allow(cfOf("k1"), now.Add(time.Duration(i)*time.Millisecond)) {
			t.Fatalf("report %d refused", i)
		}
	}
	if l.allow(cfOf("k1"), now.Add(time.Second)) {
		t.Error("a flood is allowed")
	}
	if !l.allow(cfOf("k2"), now.Add(time.Second)) {
		t.Error("another kernel pays for k1's flood")
	}
	if !l.allow(cfOf("k1"), now.Add(oomWindow+time.Second)) {
		t.Error("k1 still refused after the window")
	}
	g := 1
	l.record(oom.Event{Seq: 7, Time: 5, KernelID: "k1", ConnectionFile: cfOf("k1"), RequestedBytes: 9, GPU: &oom.GPU{Index: g}})
	l.record(oom.Event{Seq: 9, Time: 6, KernelID: "k1", ConnectionFile: cfOf("k1"), RequestedBytes: 3})
	// The third notebook shares k1's id through another file: not k1's.
	rep := attribution.Report{Notebooks: []attribution.Notebook{{KernelID: "k1", ConnectionFile: cfOf("k1")},
		{KernelID: "k3", ConnectionFile: cfOf("k3")}, {KernelID: "k1", ConnectionFile: "/home/other/kernel-k1.json"}}}
	attribution.Finish(&rep, attribution.FinishInput{OOM: l.summaries(rep)})
	s := rep.Notebooks[0].OOM
	if s == nil || s.Count != 2 || s.LastEvent != 9 || s.LastRequestedBytes != 3 || s.LastGPU != nil || s.LastTime != 6 ||
		rep.Notebooks[1].OOM != nil || rep.Notebooks[2].OOM != nil {
		t.Errorf("summary %+v, others %+v %+v", s, rep.Notebooks[1].OOM, rep.Notebooks[2].OOM)
	}
	// A kernel gone from the report is forgotten.
	l.summaries(attribution.Report{})
	if len(l.summary) != 0 || len(l.recent) != 0 {
		t.Errorf("kept %v %v", l.summary, l.recent)
	}
}

func TestRecordOOM(t *testing.T) {
	r := newRig(t, Config{})
	ctx := context.Background()
	req := oom.Request{Framework: "torch", RequestedBytes: 1 << 30}
	if _, err := r.d.api().RecordOOM(ctx, refOf("k1"), req); err == nil {
		t.Fatal("recorded before any sample")
	}
	g := 0
	r.d.mu.Lock()
	// What the daemon publishes is finished: the event's holders are its GPU's.
	rep := attribution.Report{
		GPUs:      []attribution.GPU{{Index: 0, MemoryTotalBytes: 8 << 30, FreeBytes: 1 << 20}},
		Notebooks: []attribution.Notebook{{KernelID: "k1", ConnectionFile: cfOf("k1"), Notebook: "/n/a.ipynb", User: "u", PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 2 << 30}}}},
	}
	attribution.Finish(&rep, attribution.FinishInput{})
	r.d.pub.last = metrics.Snapshot{SampledAt: time.Now(), Report: rep}
	r.d.mu.Unlock()
	ev, err := r.d.api().RecordOOM(ctx, refOf("k1"), req)
	if err != nil || ev.Seq == 0 || ev.GPU == nil || ev.GPU.Index != g || ev.Notebook != "/n/a.ipynb" {
		t.Fatalf("event %+v, %v", ev, err)
	}
	if len(ev.Holders) != 1 || !ev.Holders[0].Self || ev.Holders[0].Bytes != 2<<30 || ev.Holders[0].ConnectionFile != cfOf("k1") {
		t.Errorf("holders %+v", ev.Holders)
	}
	evs, _ := r.d.api().OOMEvents(ctx)
	if len(evs) != 1 || evs[0].Seq != ev.Seq || evs[0].Headline != ev.Headline {
		t.Errorf("events %+v", evs)
	}
	hist, _ := r.d.hist.events.After(0)
	if len(hist) != 1 || hist[0].Kind != "oom" || hist[0].OOM == nil || hist[0].OOM.Seq != hist[0].Seq || hist[0].Reason != ev.Headline ||
		hist[0].ConnectionFile != cfOf("k1") {
		t.Errorf("history %+v", hist)
	}
	for i := 1; i < oomBurst; i++ {
		if _, err := r.d.api().RecordOOM(ctx, refOf("k1"), req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.d.api().RecordOOM(ctx, refOf("k1"), req); !errors.Is(err, api.ErrTooMany) {
		t.Errorf("the %d-th report in a minute: %v", oomBurst+1, err)
	}
	r.waitLog("out-of-memory error in a kernel", `"kernel_id":"k1"`)
}

// cfOf is the connection file of a test kernel id; refOf the API's
// reference to that kernel.
func cfOf(id string) string { return "/rt/kernel-" + id + ".json" }

func refOf(id string) api.KernelRef { return api.KernelRef{ID: id, ConnectionFile: cfOf(id)} }
