package attribution

import (
	"reflect"
	"testing"
)

func nbWith(kpid int, procs ...ProcessBytes) Notebook {
	pids := []int{kpid}
	for _, p := range procs {
		if p.PID != kpid {
			pids = append(pids, p.PID)
		}
	}
	return Notebook{KernelID: "k1", ConnectionFile: "/rt/kernel-k1.json", PIDs: pids, Processes: procs}
}

func on(pid int, per ...GPUBytes) ProcessBytes { return ProcessBytes{PID: pid, PerGPU: per} }
func g(i int, b uint64) GPUBytes               { return GPUBytes{Index: i, Bytes: b} }

func TestStrayContexts(t *testing.T) {
	type flag struct {
		GPU, PID        int
		Cause, Evidence string
	}
	tests := []struct {
		name string
		nb   Notebook
		ev   FrameworkEvidence
		want []flag
	}{
		{"a kernel on one GPU is never flagged", nbWith(100, on(100, g(0, 20*gib))), FrameworkEvidence{}, nil},
		{"a kernel holding only its context after a free is never flagged", nbWith(100, on(100, g(0, 518*mib))),
			FrameworkEvidence{PID: 100, Held: map[int]uint64{}, DriverAt: map[int]uint64{0: 518 * mib}}, nil},
		{"default device: a context on GPU 0, the work on GPU 1 (driver figures only)",
			nbWith(100, on(100, g(0, 500*mib), g(1, 30*gib))), FrameworkEvidence{},
			[]flag{{0, 100, "default_device", "driver"}}},
		{"default device with framework evidence: nothing of the frameworks' on GPU 0, whatever its size",
			nbWith(100, on(100, g(0, 900*mib), g(1, 30*gib))),
			FrameworkEvidence{PID: 100, Held: map[int]uint64{1: 29 * gib}, DriverAt: map[int]uint64{0: 900 * mib, 1: 30 * gib}},
			[]flag{{0, 100, "default_device", "framework"}}},
		{"stale evidence (the kernel grew on GPU 0 since) falls back to the driver's figures",
			nbWith(100, on(100, g(0, 4*gib), g(1, 30*gib))),
			FrameworkEvidence{PID: 100, Held: map[int]uint64{1: 29 * gib}, DriverAt: map[int]uint64{0: 900 * mib, 1: 30 * gib}},
			nil},
		{"evidence of another kernel process is ignored", nbWith(100, on(100, g(0, 900*mib), g(1, 30*gib))),
			FrameworkEvidence{PID: 99, Held: map[int]uint64{1: 29 * gib}, DriverAt: map[int]uint64{0: 900 * mib}}, nil},
		{"a child that initialised CUDA and allocates nothing", nbWith(100, on(100, g(0, 8*gib)), on(101, g(0, 518*mib))),
			FrameworkEvidence{}, []flag{{0, 101, "idle_child", "driver"}}},
		{"workers that hold CUDA memory are not flagged",
			nbWith(100, on(100, g(0, 8*gib)), on(101, g(0, 774*mib)), on(102, g(0, 2*gib))), FrameworkEvidence{}, nil},
		{"a child on a GPU the kernel does not use: wrong CUDA_VISIBLE_DEVICES",
			nbWith(100, on(100, g(0, 8*gib)), on(101, g(1, 518*mib))), FrameworkEvidence{},
			[]flag{{1, 101, "visible_devices", "driver"}}},
		{"a child with a context on GPU 0 and its work on GPU 1",
			nbWith(100, on(100, g(1, 8*gib)), on(101, g(0, 518*mib), g(1, 3*gib))), FrameworkEvidence{},
			[]flag{{0, 101, "default_device", "driver"}}},
		{"unknown bytes are not judged", nbWith(100, on(100, g(0, 8*gib)), on(101, GPUBytes{Index: 0, BytesUnknown: true})),
			FrameworkEvidence{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []flag
			for _, sc := range strayContexts(tt.nb, tt.ev) {
				got = append(got, flag{sc.GPU, sc.PID, sc.Cause, sc.Evidence})
				if sc.Label == "" || sc.Why == "" || sc.Avoid == "" {
					t.Errorf("flag %+v lacks its sentences", sc)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestFlagStrayContextsLabel(t *testing.T) {
	rep := Report{Notebooks: []Notebook{nbWith(100, on(100, g(0, 8*gib)), on(101, g(0, 518*mib)))}}
	FlagStrayContexts(&rep, nil)
	sc := rep.Notebooks[0].StrayContexts
	if len(sc) != 1 || sc[0].Label != "stray context (≈ 518 MiB)" || sc[0].Bytes != 518*mib {
		t.Fatalf("got %+v", sc)
	}
	// With a kernel's evidence the flags are computed again: its own GPU 1
	// is flagged from its frameworks' figures.
	rep = Report{Notebooks: []Notebook{nbWith(100, on(100, g(0, 8*gib), g(1, 600*mib)), on(101, g(0, 518*mib)))}}
	ev := FrameworkEvidence{PID: 100, Held: map[int]uint64{0: 7 * gib}, DriverAt: map[int]uint64{0: 8 * gib, 1: 600 * mib}}
	FlagStrayContexts(&rep, map[string]FrameworkEvidence{"/rt/kernel-k1.json": ev})
	got := rep.Notebooks[0].StrayContexts
	if len(got) != 2 || got[0].PID != 101 || got[1].GPU != 1 || got[1].PID != 100 || got[1].Evidence != "framework" {
		t.Fatalf("got %+v", got)
	}
	// Evidence is a kernel's by its connection file: another kernel that
	// shares the id (another user's file named after it) gives none.
	rep = Report{Notebooks: []Notebook{nbWith(100, on(100, g(0, 8*gib), g(1, 600*mib)), on(101, g(0, 518*mib)))}}
	FlagStrayContexts(&rep, map[string]FrameworkEvidence{"/home/mallory/rt/kernel-k1.json": ev})
	for _, sc := range rep.Notebooks[0].StrayContexts {
		if sc.Evidence != "driver" {
			t.Fatalf("evidence of another file of the same id was used: %+v", sc)
		}
	}
}

// A flag stands once its process's figure on that GPU is steady since the
// previous sample: a worker creating its context is not flagged at its
// first small figure, and a stray context is, from its second sample on.
func TestKeepSteadyStrays(t *testing.T) {
	starting := nbWith(100, on(100, g(0, 8*gib)), on(101, g(0, 14*mib)))
	settled := nbWith(100, on(100, g(0, 8*gib)), on(101, g(0, 518*mib)))
	other := settled
	other.ConnectionFile = "/home/b/rt/kernel-k1.json"
	tests := []struct {
		name string
		prev *Report
		now  Notebook
		want int // flags kept
	}{
		{"no previous sample (one report): every flag", nil, settled, 1},
		{"first seen this sample", &Report{Notebooks: []Notebook{nbWith(100, on(100, g(0, 8*gib)))}}, settled, 0},
		{"grew since (14 MiB, then 518 MiB)", &Report{Notebooks: []Notebook{starting}}, settled, 0},
		{"the same figure twice", &Report{Notebooks: []Notebook{settled}}, settled, 1},
		{"steady, but under another kernel's file (an id two files share)", &Report{Notebooks: []Notebook{other}}, settled, 0},
		{"shrank since", &Report{Notebooks: []Notebook{nbWith(100, on(100, g(0, 8*gib)), on(101, g(0, 600*mib)))}}, settled, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Report{Notebooks: []Notebook{tt.now}}
			Finish(&rep, FinishInput{Previous: tt.prev})
			if got := len(rep.Notebooks[0].StrayContexts); got != tt.want {
				t.Errorf("flags %+v, want %d", rep.Notebooks[0].StrayContexts, tt.want)
			}
		})
	}
}
