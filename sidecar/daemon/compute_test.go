package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/history"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// computing makes pids compute (90 % SM) on the rig's GPU from the next
// sample on; the GPU's processes are twoKernels'.
func (r *rig) computing(pids ...int) {
	r.mu.Lock()
	for _, pid := range pids {
		r.sm[pid] = 90
	}
	r.mu.Unlock()
	r.setGPU(100, 1<<30, 101, 2<<30, 103, 3<<30, 104, 4<<30, 200, 1<<30, 201, 5<<30)
}

// counter is a counter's value in the daemon's registry, by one label.
func (r *rig) counter(name, label, value string) float64 {
	r.t.Helper()
	fams, err := r.d.metrics.Registry().Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	r.t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

func (r *rig) lastReport() attribution.Report {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	return r.d.pub.last.Report
}

// A survivor that computes on a GPU is left running (logged, counted,
// listed with its sentence, an event for JupyterLab); one that only holds
// memory is ended as before. Its user may then end it explicitly.
func TestReclaimLeavesAComputingSurvivorRunning(t *testing.T) {
	r, k1, _ := twoKernels(t, Config{Reclaim: true})
	r.computing(104)
	r.d.sample(r.ctx)
	r.d.sample(r.ctx)
	r.exit(100)
	r.d.sample(r.ctx)
	r.waitLog("orphan ended", `"pid":101`)
	r.waitLog("orphan left running: computing", `"pid":104`, "computing on a GPU")
	if got := r.kills(); !slices.Equal(got, []int{101}) {
		t.Fatalf("ended %v, want [101] (104 computes)", got)
	}
	if n := r.counter("gpumem_reclaim_left_running_total", "reason", attribution.ComputeComputing); n != 1 {
		t.Errorf("gpumem_reclaim_left_running_total{reason=computing} = %v, want 1", n)
	}
	r.d.sample(r.ctx)
	rep := r.lastReport()
	if len(rep.LeftRunning) != 1 || rep.LeftRunning[0].PID != 104 || rep.LeftRunning[0].KernelID != "k1" || rep.LeftRunning[0].ConnectionFile != k1 {
		t.Fatalf("left running: %+v", rep.LeftRunning)
	}
	lr := rep.LeftRunning[0]
	want := "a job started from kernel k1 (pid 104, `python server.py`) is still computing on GPU 0 with 4.0 GiB: left running"
	if lr.Message != want || lr.Reason != attribution.ComputeComputing || !slices.Equal(lr.GPUs, []int{0}) {
		t.Errorf("left running %+v\nwant message %q", lr, want)
	}
	events, _ := r.d.hist.events.After(0)
	if i := slices.IndexFunc(events, func(e history.Event) bool { return e.Kind == "left_running" }); i < 0 ||
		events[i].PID != 104 || events[i].Message != want || events[i].StartTime != 104 {
		t.Errorf("events %+v: want one left_running for pid 104", events)
	}

	// Never through another kernel of the same id (another user's file
	// named after it), nor for a user the process is not recorded as.
	ref := api.KernelRef{ID: "k1", ConnectionFile: k1}
	twin := api.KernelRef{ID: "k1", ConnectionFile: "/home/other/kernel-k1.json"}
	if _, err := r.d.api().EndOrphans(r.ctx, twin, "", api.EndOrphansRequest{}); !errors.Is(err, api.ErrKernelNotFound) {
		t.Errorf("ending through another file of the same id: %v, want ErrKernelNotFound", err)
	}
	if _, err := r.d.api().EndOrphans(r.ctx, ref, "not-"+lr.User, api.EndOrphansRequest{}); !errors.Is(err, api.ErrKernelNotFound) {
		t.Errorf("ending as a user the process is not recorded as: %v, want ErrKernelNotFound", err)
	}
	if got := r.kills(); !slices.Equal(got, []int{101}) {
		t.Fatalf("ended %v, want only [101]", got)
	}
	// The explicit end: a pid never left running is refused, 104 is ended.
	reply, err := r.d.api().EndOrphans(r.ctx, ref, lr.User, api.EndOrphansRequest{PIDs: []int{101, 104}})
	if err != nil {
		t.Fatal(err)
	}
	if len(reply.Processes) != 2 || reply.Processes[0].Ended || !strings.Contains(reply.Processes[0].Reason, "not a process gpumem left running") ||
		!reply.Processes[1].Ended || reply.Processes[1].PID != 104 {
		t.Errorf("end reply %+v", reply)
	}
	if got := r.kills(); !slices.Equal(got, []int{101, 104}) {
		t.Errorf("ended %v, want [101 104]", got)
	}
	if _, err := r.d.api().EndOrphans(r.ctx, ref, "", api.EndOrphansRequest{}); !errors.Is(err, api.ErrKernelNotFound) {
		t.Errorf("nothing left running: %v, want ErrKernelNotFound", err)
	}
}

// A survivor idle at the kernel's exit that starts computing during the
// grace window is left running.
func TestReclaimSurvivorStartsComputingDuringTheGrace(t *testing.T) {
	r, _, _ := twoKernels(t, Config{Reclaim: true, ReclaimGrace: 2 * time.Second})
	r.d.sample(r.ctx)
	r.exit(100)
	r.d.sample(r.ctx)
	r.computing(101)
	r.d.sample(r.ctx)
	r.d.sample(r.ctx)
	r.waitLog("orphan left running: computing", `"pid":101`)
	r.waitLog("orphan ended", `"pid":104`)
	if got := r.kills(); !slices.Equal(got, []int{104}) {
		t.Errorf("ended %v, want [104]", got)
	}
}

// A GPU that cannot say: survivors are left running (never judged idle
// from unknown) unless --reclaim-unknown=end.
func TestReclaimUnknownUtilization(t *testing.T) {
	for _, tc := range []struct {
		unknown string
		ended   []int
	}{{ReclaimKeep, nil}, {ReclaimEnd, []int{101, 104}}} {
		t.Run(tc.unknown, func(t *testing.T) {
			r := newRig(t, Config{Reclaim: true, Compute: ComputeConfig{ReclaimUnknown: tc.unknown}})
			r.noUtil = true
			rr, _, _ := twoKernelsOn(t, r)
			rr.d.sample(rr.ctx)
			rr.exit(100)
			rr.d.sample(rr.ctx)
			if tc.unknown == ReclaimKeep {
				rr.waitLog("orphan left running: unknown", `"pid":101`, "GPU utilization is unknown")
				rr.waitLog("orphan left running: unknown", `"pid":104`)
			} else {
				rr.waitLog("orphan ended", `"pid":101`)
				rr.waitLog("orphan ended", `"pid":104`)
			}
			if got := sortInts(rr.kills()); !slices.Equal(got, tc.ended) {
				t.Errorf("ended %v, want %v", got, tc.ended)
			}
		})
	}
}

// Each notebook's verdict, the kernel's last computation (what culling
// reads) and hoarding: the idle holder hoards, the computing one does not.
func TestComputeVerdictsAndHoarding(t *testing.T) {
	r, k1file, k2file := twoKernels(t, Config{Reclaim: true})
	r.computing(201)
	for range 4 {
		time.Sleep(5 * time.Millisecond) // the samples' times must differ: hoarding counts held time
		r.d.sample(r.ctx)
	}
	rep := r.lastReport()
	byID := map[string]attribution.Notebook{}
	for _, nb := range rep.Notebooks {
		byID[nb.KernelID] = nb
	}
	k1, k2 := byID["k1"], byID["k2"]
	if k1.Compute == nil || k1.Compute.State != attribution.ComputeIdle || k2.Compute == nil || k2.Compute.State != attribution.ComputeComputing {
		t.Fatalf("verdicts: k1 %+v, k2 %+v", k1.Compute, k2.Compute)
	}
	if k1.Compute.HoardedGiBHours == nil || *k1.Compute.HoardedGiBHours <= 0 {
		t.Errorf("k1 holds memory computing nothing: hoarded %v", k1.Compute.HoardedGiBHours)
	}
	if k2.Compute.HoardedGiBHours == nil || *k2.Compute.HoardedGiBHours != 0 || k2.Compute.LastComputedAt.IsZero() {
		t.Errorf("k2 computes: hoarded %v, last computed %v", k2.Compute.HoardedGiBHours, k2.Compute.LastComputedAt)
	}
	if r.d.compute.kernelComputedAt(k2file).IsZero() || !r.d.compute.kernelComputedAt(k1file).IsZero() {
		t.Errorf("computed at: k1 %v, k2 %v", r.d.compute.kernelComputedAt(k1file), r.d.compute.kernelComputedAt(k2file))
	}
	if k2.Utilization == nil || k2.Utilization.SMPercent != 90 || k1.Utilization == nil || k1.Utilization.SMPercent != 0 {
		t.Errorf("utilization: k1 %+v, k2 %+v", k1.Utilization, k2.Utilization)
	}
	// A row read now (KernelNow, ?fresh=1) is finished as a sampled row
	// is: the same verdict, peak and JSON fields, its figures read now.
	now, err := r.d.api().KernelNow(r.ctx, api.KernelRef{ID: "k2", ConnectionFile: k2file})
	if err != nil {
		t.Fatal(err)
	}
	if now.Compute == nil || now.Compute.State != k2.Compute.State || now.PeakBytes != k2.PeakBytes || now.PeakBytes == 0 {
		t.Errorf("row read now: compute %+v, peak %d; sampled: %+v, %d", now.Compute, now.PeakBytes, k2.Compute, k2.PeakBytes)
	}
	if got, want := jsonKeys(t, now), jsonKeys(t, k2); !slices.Equal(got, want) {
		t.Errorf("row read now has fields %v, a sampled row %v", got, want)
	}
	if len(rep.Hoarding) != 1 || rep.Hoarding[0].GiBHours <= 0 || rep.Hoarding[0].WindowSeconds != 86400 {
		t.Errorf("hoarding per user: %+v", rep.Hoarding)
	}
}

func TestLeftRunningMessage(t *testing.T) {
	lr := attribution.LeftRunning{KernelID: "7f1371c2-aaaa", Notebook: "/home/alice/train.ipynb", PID: 4242,
		Command: "python train.py", GPUs: []int{0}, Bytes: 20 << 30, Reason: attribution.ComputeComputing}
	if got, want := leftRunningMessage(lr, ""), "a job started from train.ipynb (pid 4242, `python train.py`) is still computing on GPU 0 with 20.0 GiB: left running"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	lr.Notebook, lr.GPUs, lr.Reason = "", []int{0, 3}, attribution.ComputeUnknown
	lr.Command = strings.Repeat("x", 100)
	got := leftRunningMessage(lr, "MIG")
	for _, part := range []string{"from kernel 7f1371c2 ", "holds 20.0 GiB on GPUs 0, 3", "unknown (MIG): left running", strings.Repeat("x", 59) + "…`"} {
		if !strings.Contains(got, part) {
			t.Errorf("%q lacks %q", got, part)
		}
	}
}

// The compute step of one sample (record the readings, judge every
// notebook over a minute of them, hoarding) at 1,000 notebooks of a kernel
// and a worker each, on 8 GPUs, with a minute of readings kept.
func BenchmarkComputeStep1000(b *testing.B) {
	var ps []procs.Proc
	snap := nvml.Snapshot{}
	for i := range 8 {
		snap.Devices = append(snap.Devices, nvml.Device{Index: i, MemoryTotalBytes: 141 << 30})
	}
	var kernels []attribution.Kernel
	for k := range 1000 {
		pid := 10000 + 2*k
		ps = append(ps, procs.Proc{PID: pid, PPID: 1, PGID: pid, SID: pid, StartTime: uint64(pid)},
			procs.Proc{PID: pid + 1, PPID: pid, PGID: pid, SID: pid, StartTime: uint64(pid + 1)})
		kernels = append(kernels, attribution.Kernel{ID: fmt.Sprintf("k%d", k), PID: pid, StartTime: uint64(pid)})
		d := &snap.Devices[k%8]
		for _, p := range []int{pid, pid + 1} {
			d.Processes = append(d.Processes, nvml.Process{PID: p, UsedBytes: 1 << 30, UsedKnown: true,
				Util: nvml.Utilization{Known: true, SMPercent: uint32(k % 3 * 40), SampledAt: uint64(k)}})
		}
	}
	table := procs.NewTable(ps)
	cfg := ComputeConfig{}
	cfg.defaults()
	c := newComputeState(cfg, time.Second, 5*time.Second, 24*time.Hour)
	now := time.Now()
	for i := range 60 {
		c.record(now.Add(time.Duration(i-60)*time.Second), snap, table)
	}
	rep := attribution.Attribute(snap, table, kernels)
	attribution.AddUtilization(&rep, snap)
	var facts *attribution.ComputeFacts
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		at := now.Add(time.Duration(i) * time.Second)
		c.record(at, snap, table)
		facts = c.judgeReport(at, &rep, snap, table)
	}
	if _, ok := facts.Kernels[rep.Notebooks[0].ConnectionFile]; !ok {
		b.Fatal("no verdict")
	}
}

// jsonKeys is the top-level JSON fields of v, sorted.
func jsonKeys(t *testing.T, v any) []string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return slices.Sorted(maps.Keys(m))
}

// A process's readings slide: each kept in order, the forgotten gone, and
// once the window is full an append reuses the array (no allocation).
func TestProcReadingsSlide(t *testing.T) {
	var r procReadings
	const window = 60
	for i := range 1000 {
		r.add(utilSample{at: sampleTime(i), sm: uint32(i)})
		if n := len(r.samples()); n > window {
			r.forget(ComputeConfig{}, n-window)
		}
		ss := r.samples()
		if len(ss) != min(i+1, window) || ss[len(ss)-1].at != sampleTime(i) || ss[0].at != sampleTime(max(0, i+1-window)) {
			t.Fatalf("after %d: %d readings, %v … %v", i, len(ss), ss[0].at, ss[len(ss)-1].at)
		}
		for j := 1; j < len(ss); j++ {
			if ss[j].at != ss[j-1].at+1 || ss[j].sm != uint32(ss[j].at) {
				t.Fatalf("after %d: reading %d is %+v after %+v", i, j, ss[j], ss[j-1])
			}
		}
	}
	i := 1000
	allocs := testing.AllocsPerRun(200, func() {
		r.add(utilSample{at: sampleTime(i)})
		r.forget(ComputeConfig{}, 1)
		i++
	})
	if allocs != 0 {
		t.Errorf("a full window's append allocates %.1f times", allocs)
	}
	if c := cap(r.buf); c > window*3/2+8 {
		t.Errorf("%d readings kept in an array of %d", window, c)
	}
}

// A process whose readings are all known and idle is judged by their
// count (judgeIdle); every judgement equals the policy's look at each
// reading, over readings recorded as samples record them (several GPUs'
// lines of a process merged; a reclaim's record with an earlier time
// crossing a sample's), for windows of every length and place.
func TestJudgeByCountsMatchesJudge(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	cfg := ComputeConfig{ThresholdPercent: 5}
	cfg.defaults()
	c := newComputeState(cfg, time.Second, 5*time.Second, time.Hour)
	var ps []procs.Proc
	for pid := 10; pid < 30; pid++ {
		ps = append(ps, procs.Proc{PID: pid, PPID: 1, StartTime: uint64(pid)})
	}
	table := procs.NewTable(ps)
	start := time.Now()
	fast := 0
	for tick := range 400 {
		now := start.Add(time.Duration(tick) * time.Second)
		if tick >= 300 && rng.IntN(15) == 0 {
			now = now.Add(-time.Duration(rng.IntN(1500)) * time.Millisecond) // before the last record
		}
		snap := nvml.Snapshot{Devices: []nvml.Device{{Index: 0}, {Index: 1}}}
		for pid := 10; pid < 30; pid++ {
			// Pids 10-14 idle throughout, 15-19 idle for long spells, the
			// rest anything.
			lines := 1 + rng.IntN(2)
			for l := range lines {
				u := nvml.Utilization{Known: true, SampledAt: uint64(tick / (1 + rng.IntN(3)))}
				switch {
				case pid < 15:
				case pid < 20 && (tick/60)%2 == 0:
				default:
					u.Known = rng.IntN(6) != 0
					u.SMPercent, u.MemoryPercent = uint32(rng.IntN(12)), uint32(rng.IntN(8))
				}
				d := &snap.Devices[l]
				d.Processes = append(d.Processes, nvml.Process{PID: pid, Util: u})
			}
		}
		c.record(now, snap, table)
		c.mu.Lock()
		for pid := 10; pid < 30; pid++ {
			id := procID{pid, uint64(pid)}
			for range 3 {
				to := now.Add(-time.Duration(rng.IntN(5000)) * time.Millisecond)
				from := to.Add(-time.Duration(rng.IntN(90000)) * time.Millisecond)
				got, want := c.judgeLocked(id, from, to), cfg.judge(c.samplesLocked(id), from, to)
				if got != want {
					c.mu.Unlock()
					t.Fatalf("tick %d, pid %d, [%v, %v]: %+v, want %+v", tick, pid, from.Sub(start), to.Sub(start), got, want)
				}
			}
			if r := c.procs[id]; r.unknown == 0 && r.active == 0 && !r.unsorted {
				fast++
			}
		}
		c.mu.Unlock()
	}
	if fast < 300*5 {
		t.Errorf("%d judgements by the counts, want the idle processes' every one before the crossing", fast)
	}
}
