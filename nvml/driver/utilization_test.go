package driver

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpumem/gpumem/nvml"
)

// utilRig is one canned H100 with processes 10 (computing), 20 (holding
// memory only) and a clock the test moves; NVML's answers are scripted per
// call, and what each call asked for is kept.
type utilRig struct {
	srv   *server.Server
	dev   *server.Device
	r     *real
	clock time.Time

	mu      sync.Mutex
	asked   []uint64 // lastSeenTimeStamp of each call
	answers []func(since uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return)
}

func newUtilRig(t *testing.T) *utilRig {
	t.Helper()
	srv := dgxh100.NewWithGPUs(dgxh100.NewDevice(0).Config)
	dev := srv.Devices[0].(*server.Device)
	dev.MemoryInfo = gonvml.Memory{Total: 80 * gib, Used: 3 * gib}
	dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) { return gonvml.Memory_v2{}, gonvml.ERROR_NOT_SUPPORTED }
	setProcesses(dev, []gonvml.ProcessInfo{info(10, 2*gib), info(20, gib)}, nil, nil)
	g := &utilRig{srv: srv, dev: dev, clock: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	dev.GetProcessUtilizationFunc = func(since uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.asked = append(g.asked, since)
		if len(g.answers) == 0 {
			return nil, gonvml.ERROR_NOT_FOUND
		}
		a := g.answers[0]
		g.answers = g.answers[1:]
		return a(since)
	}
	src, r := openLibrary(srv, 2*time.Second)
	t.Cleanup(func() { _ = src.Close() })
	r.util.now = func() time.Time { return g.clock }
	g.r = r
	return g
}

// us is the rig's clock, d from now, in NVML's microseconds.
func (g *utilRig) us(d time.Duration) uint64 { return uint64(g.clock.Add(d).UnixMicro()) }

func (g *utilRig) answer(samples []gonvml.ProcessUtilizationSample, ret gonvml.Return) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.answers = append(g.answers, func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) { return samples, ret })
}

// sample reads the device once and returns pid → utilization.
func (g *utilRig) sample(t *testing.T) (map[int]nvml.Utilization, nvml.Device, []string) {
	t.Helper()
	snap, err := g.r.Sample(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	d := snap.Devices[0]
	out := map[int]nvml.Utilization{}
	for _, p := range d.Processes {
		out[p.PID] = p.Util
	}
	return out, d, snap.Warnings
}

func sampleOf(pid uint32, ts uint64, sm, mem uint32) gonvml.ProcessUtilizationSample {
	return gonvml.ProcessUtilizationSample{Pid: pid, TimeStamp: ts, SmUtil: sm, MemUtil: mem}
}

// A process NVML lists computes what it says; one it does not list (it
// only holds memory) computes 0, known. Each call asks for what came after
// the newest sample seen; a reading stays the figure for the window, then
// goes.
func TestProcessUtilization(t *testing.T) {
	g := newUtilRig(t)
	t0 := g.us(-100 * time.Millisecond)
	g.answer([]gonvml.ProcessUtilizationSample{sampleOf(10, t0, 97, 6)}, gonvml.SUCCESS)
	u, d, warnings := g.sample(t)
	if d.UtilizationMissing != "" || len(warnings) != 0 {
		t.Fatalf("missing %q, warnings %q", d.UtilizationMissing, warnings)
	}
	if want := (nvml.Utilization{Known: true, SMPercent: 97, MemoryPercent: 6, SampledAt: t0}); u[10] != want {
		t.Errorf("pid 10: %+v, want %+v", u[10], want)
	}
	if want := (nvml.Utilization{Known: true}); u[20] != want {
		t.Errorf("pid 20 (holds memory only): %+v, want known 0", u[20])
	}

	// A second later NVML has nothing newer: the reading still stands.
	g.clock = g.clock.Add(time.Second)
	u, _, _ = g.sample(t)
	if u[10].SMPercent != 97 || u[10].SampledAt != t0 {
		t.Errorf("within the window: pid 10 %+v, want the same reading", u[10])
	}
	// A newer reading replaces it.
	t1 := g.us(-10 * time.Millisecond)
	g.answer([]gonvml.ProcessUtilizationSample{sampleOf(10, t1, 40, 2), sampleOf(20, t1, 3, 0)}, gonvml.SUCCESS)
	u, _, _ = g.sample(t)
	if u[10].SMPercent != 40 || u[10].SampledAt != t1 || u[20].SMPercent != 3 {
		t.Errorf("newer reading: pid 10 %+v, pid 20 %+v", u[10], u[20])
	}
	// Past the window without a newer reading: 0.
	g.clock = g.clock.Add(3 * time.Second)
	u, _, _ = g.sample(t)
	if want := (nvml.Utilization{Known: true}); u[10] != want || u[20] != want {
		t.Errorf("after the window: pid 10 %+v, pid 20 %+v, want known 0", u[10], u[20])
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if want := []uint64{0, t0, t0, t1}; fmt.Sprint(g.asked) != fmt.Sprint(want) {
		t.Errorf("lastSeenTimeStamp asked: %v, want %v (0 first: every sample the driver keeps)", g.asked, want)
	}
}

// What NVML answers besides samples, and what it means.
func TestProcessUtilizationAnswers(t *testing.T) {
	tests := []struct {
		name        string
		answers     func(g *utilRig)
		wantKnown   bool
		wantSM10    uint32
		wantMissing string
		wantWarning string
	}{
		{name: "NOT_FOUND: no process ran a kernel", wantKnown: true,
			answers: func(g *utilRig) {
				g.answer(make([]gonvml.ProcessUtilizationSample, 72), gonvml.ERROR_NOT_FOUND) // zeroed entries, as measured
			}},
		{name: "no samples counted", wantKnown: true,
			answers: func(g *utilRig) { g.answer([]gonvml.ProcessUtilizationSample{}, gonvml.ERROR_INSUFFICIENT_SIZE) }},
		{name: "zeroed and impossible entries are dropped", wantKnown: true, wantSM10: 50,
			answers: func(g *utilRig) {
				g.answer([]gonvml.ProcessUtilizationSample{{}, sampleOf(10, g.us(0), 50, 1), sampleOf(20, g.us(0), 250, 0)}, gonvml.SUCCESS)
			}},
		{name: "a sample older than the window is not the figure", wantKnown: true,
			answers: func(g *utilRig) {
				g.answer([]gonvml.ProcessUtilizationSample{sampleOf(10, g.us(-time.Minute), 100, 9)}, gonvml.SUCCESS)
			}},
		{name: "not supported: unknown, no warning", wantMissing: utilNotSupported,
			answers: func(g *utilRig) { g.answer(nil, gonvml.ERROR_NOT_SUPPORTED) }},
		{name: "an error: unknown, and a warning", wantMissing: "nvml process utilization", wantWarning: "gpu 0: nvml process utilization",
			answers: func(g *utilRig) { g.answer(nil, gonvml.ERROR_GPU_IS_LOST) }},
		{name: "the count grew once: asked again", wantKnown: true, wantSM10: 80,
			answers: func(g *utilRig) {
				g.answer([]gonvml.ProcessUtilizationSample{sampleOf(10, g.us(0), 1, 1)}, gonvml.ERROR_INSUFFICIENT_SIZE)
				g.answer([]gonvml.ProcessUtilizationSample{sampleOf(10, g.us(0), 80, 1)}, gonvml.SUCCESS)
			}},
		{name: "go-nvml panics as the count grows, twice: unknown, a warning", wantMissing: "grew during the query",
			wantWarning: "grew during the query",
			answers: func(g *utilRig) {
				for range 2 {
					g.mu.Lock()
					g.answers = append(g.answers, func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
						var buf []gonvml.ProcessUtilizationSample
						n := 3
						return buf[:n], gonvml.SUCCESS // what go-nvml does when NVML's count outgrows its buffer
					})
					g.mu.Unlock()
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newUtilRig(t)
			tt.answers(g)
			u, d, warnings := g.sample(t)
			if !strings.Contains(d.UtilizationMissing, tt.wantMissing) || (tt.wantMissing == "") != (d.UtilizationMissing == "") {
				t.Errorf("UtilizationMissing = %q, want %q", d.UtilizationMissing, tt.wantMissing)
			}
			for pid, got := range u {
				want := nvml.Utilization{Known: tt.wantKnown}
				if pid == 10 && tt.wantSM10 > 0 {
					want.SMPercent, want.MemoryPercent, want.SampledAt = tt.wantSM10, 1, g.us(0)
				}
				if got != want {
					t.Errorf("pid %d: %+v, want %+v", pid, got, want)
				}
			}
			switch {
			case tt.wantWarning == "" && len(warnings) > 0:
				t.Errorf("warnings %q, want none", warnings)
			case tt.wantWarning != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], tt.wantWarning)):
				t.Errorf("warnings %q, want one with %q", warnings, tt.wantWarning)
			}
		})
	}
}

// A driver without nvmlDeviceGetProcessUtilization is never asked (the
// call would abort the process; here the mock's nil func would panic): its
// processes' utilization is unknown, never 0. (MIG: TestMIG.)
func TestProcessUtilizationUnknown(t *testing.T) {
	t.Run("symbol missing", func(t *testing.T) {
		srv, devs := h100(t)
		setProcesses(devs[0], []gonvml.ProcessInfo{info(10, gib)}, nil, nil)
		for _, d := range devs {
			d.GetProcessUtilizationFunc = nil
		}
		srv.LookupSymbolFunc = func(name string) error {
			if name == "nvmlDeviceGetProcessUtilization" {
				return errors.New("undefined symbol")
			}
			return nil
		}
		snap := sample(t, open(t, Options{Library: srv}))
		d := snap.Devices[0]
		if d.UtilizationMissing != utilNoSymbol || d.Processes[0].Util.Known || len(snap.Warnings) != 0 {
			t.Errorf("missing %q, pid 10 %+v, warnings %q: want unknown, no warning", d.UtilizationMissing, d.Processes[0].Util, snap.Warnings)
		}
	})
}

// The cost of the per-process utilization query in a sample: 1,000
// processes over 8 GPUs (125 each), every one computing, against the same
// sample on a driver without the call. go-nvml's mocks answer in memory, so
// this is gpumem's own share; the driver's is measured on the GPU host
// (scripts/gpuhost/util_check.py).
func BenchmarkSampleUtilization1000(b *testing.B) {
	for _, withUtil := range []bool{false, true} {
		b.Run(fmt.Sprintf("utilization=%v", withUtil), func(b *testing.B) {
			srv, devs := h100(b)
			var ts uint64 = uint64(time.Now().UnixMicro())
			for i, d := range devs {
				var infos []gonvml.ProcessInfo
				var samples []gonvml.ProcessUtilizationSample
				for j := range 125 {
					pid := uint32(1000 + 125*i + j)
					infos = append(infos, info(pid, 64<<20))
					samples = append(samples, sampleOf(pid, 0, uint32(j%101), 3))
				}
				setProcesses(d, infos, nil, nil)
				d.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
					// A new timestamp each call, as a running job's.
					ts++
					out := make([]gonvml.ProcessUtilizationSample, len(samples))
					for k := range samples {
						out[k] = samples[k]
						out[k].TimeStamp = ts
					}
					return out, gonvml.SUCCESS
				}
			}
			srv.LookupSymbolFunc = func(name string) error {
				if name == "nvmlDeviceGetProcessUtilization" && !withUtil {
					return errors.New("undefined symbol")
				}
				return nil
			}
			src := open(b, Options{Library: srv})
			ctx := b.Context()
			for b.Loop() {
				snap, err := src.Sample(ctx)
				if err != nil || len(snap.Devices) != 8 || len(snap.Devices[0].Processes) != 125 {
					b.Fatalf("sample: %v", err)
				}
				if withUtil != snap.Devices[7].Processes[100].Util.Known {
					b.Fatalf("utilization known = %v", !withUtil)
				}
			}
		})
	}
}
