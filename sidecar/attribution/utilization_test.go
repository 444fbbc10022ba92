package attribution

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/procs"
)

func busy(p nvml.Process, sm, mem uint32) nvml.Process {
	p.Util = nvml.Utilization{Known: true, SMPercent: sm, MemoryPercent: mem}
	return p
}

func idle(p nvml.Process) nvml.Process { return busy(p, 0, 0) }

func pct(sm, mem uint32) *Utilization { return &Utilization{SMPercent: sm, MemoryPercent: mem} }

// utilOf renders a figure for table comparisons: "unknown" or "sm/mem".
func utilOf(u *Utilization) string {
	if u == nil {
		return "unknown"
	}
	b, _ := json.Marshal(u)
	return string(b)
}

// Utilization is charged as memory is: a kernel's children count, a
// process of no kernel counts for none, a GPU that cannot say makes every
// figure it touches unknown (never 0).
func TestAddUtilization(t *testing.T) {
	tests := []struct {
		name string
		snap nvml.Snapshot
		// want: figures by what they are of ("nb a", "nb a gpu 0",
		// "pid 101 gpu 1", "other 300 gpu 0", "gpu 0").
		want map[string]string
	}{
		{
			name: "kernel and children on two GPUs; another user's job computes on GPU 0",
			snap: nvml.Snapshot{Devices: []nvml.Device{
				device(0, 80*gib, 8*gib, busy(gpuProc(100, 2*gib), 30, 5), idle(gpuProc(102, gib)), busy(gpuProc(300, 4*gib), 60, 20)),
				device(1, 80*gib, gib, busy(gpuProc(101, 512*mib), 90, 10), busy(gpuProc(103, 256*mib), 20, 1)),
			}},
			want: map[string]string{
				"nb a": utilOf(pct(130, 16)), "nb a gpu 0": utilOf(pct(30, 5)), "nb a gpu 1": utilOf(pct(100, 11)),
				"pid 101 gpu 1": utilOf(pct(90, 10)), "pid 102 gpu 0": utilOf(pct(0, 0)),
				"nb b": utilOf(pct(0, 0)), "other 300 gpu 0": utilOf(pct(60, 20)),
				"gpu 0": utilOf(pct(90, 25)), "gpu 1": utilOf(pct(100, 11)),
			},
		},
		{
			name: "a GPU that cannot say: its figures unknown, the other GPU's known",
			snap: nvml.Snapshot{Devices: []nvml.Device{
				device(0, 80*gib, 3*gib, busy(gpuProc(100, 2*gib), 30, 5)),
				{Index: 1, UUID: "GPU-b", MemoryTotalBytes: 80 * gib, UtilizationMissing: "MIG", Processes: []nvml.Process{gpuProc(101, gib), gpuProc(300, gib)}},
			}},
			want: map[string]string{
				"nb a": "unknown", "nb a gpu 0": utilOf(pct(30, 5)), "nb a gpu 1": "unknown", "pid 101 gpu 1": "unknown",
				"nb b": "unknown", "other 300 gpu 1": "unknown", "gpu 0": utilOf(pct(30, 5)), "gpu 1": "unknown",
			},
		},
		{
			name: "one unknown reading among known ones on a GPU",
			snap: nvml.Snapshot{Devices: []nvml.Device{
				device(0, 80*gib, 3*gib, busy(gpuProc(100, 2*gib), 30, 5), gpuProc(101, gib)),
			}},
			want: map[string]string{"nb a": "unknown", "nb a gpu 0": "unknown", "pid 100 gpu 0": utilOf(pct(30, 5)),
				"pid 101 gpu 0": "unknown", "gpu 0": "unknown"},
		},
		{
			name: "no driver: nothing is known",
			snap: nvml.Snapshot{Devices: []nvml.Device{}, Warnings: []string{nvml.NoDriverWarning}},
			want: map[string]string{"nb a": "unknown", "nb b": "unknown"},
		},
		{
			name: "MPS: processes at once sum past 100, a GPU's share stops at 100",
			snap: nvml.Snapshot{Devices: []nvml.Device{
				device(0, 80*gib, 3*gib, busy(gpuProc(100, gib), 70, 60), busy(gpuProc(101, gib), 70, 60)),
			}},
			want: map[string]string{"nb a": utilOf(pct(100, 100)), "nb a gpu 0": utilOf(pct(100, 100)), "gpu 0": utilOf(pct(100, 100))},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Attribute(tt.snap, procs.NewTable(box), []Kernel{kernelA, kernelB})
			AddUtilization(&rep, tt.snap)
			again := rep
			AddUtilization(&again, tt.snap) // idempotent
			got := figures(rep)
			for k, want := range tt.want {
				if got[k] != want {
					t.Errorf("%s: %s, want %s", k, got[k], want)
				}
			}
			if g2 := figures(again); len(g2) != len(got) {
				t.Errorf("applied twice: %v, once: %v", g2, got)
			}
			for k, v := range figures(again) {
				if got[k] != v {
					t.Errorf("applied twice, %s: %s, once %s", k, v, got[k])
				}
			}
		})
	}
}

func figures(rep Report) map[string]string {
	out := map[string]string{}
	for _, nb := range rep.Notebooks {
		name := "nb " + strings.ToLower(nb.KernelID[:1])
		out[name] = utilOf(nb.Utilization)
		for _, pg := range nb.PerGPU {
			out[name+" gpu "+itoa(pg.Index)] = utilOf(pg.Utilization)
		}
		for _, p := range nb.Processes {
			for _, pg := range p.PerGPU {
				out["pid "+itoa(p.PID)+" gpu "+itoa(pg.Index)] = utilOf(pg.Utilization)
			}
		}
	}
	for _, o := range rep.Other {
		for _, pg := range o.PerGPU {
			out["other "+itoa(o.PID)+" gpu "+itoa(pg.Index)] = utilOf(pg.Utilization)
		}
	}
	for _, g := range rep.GPUs {
		out["gpu "+itoa(g.Index)] = utilOf(g.Utilization)
	}
	return out
}

func itoa(n int) string { return joinInts([]int{n}) }

// The JSON: an unknown figure is absent, a known 0 is there.
func TestUtilizationJSON(t *testing.T) {
	snap := nvml.Snapshot{Devices: []nvml.Device{device(0, 100, 30, idle(gpuProc(100, 10)))}}
	rep := Attribute(snap, procs.NewTable(box), []Kernel{kernelA})
	AddUtilization(&rep, snap)
	b, _ := json.Marshal(rep.Notebooks[0])
	if !strings.Contains(string(b), `"utilization":{"sm_percent":0,"memory_percent":0}`) {
		t.Errorf("known 0: %s", b)
	}
	snap.Devices[0].UtilizationMissing = "MIG"
	snap.Devices[0].Processes[0].Util = nvml.Utilization{}
	rep = Attribute(snap, procs.NewTable(box), []Kernel{kernelA})
	AddUtilization(&rep, snap)
	b, _ = json.Marshal(rep)
	if strings.Contains(string(b), `"utilization":`) || !strings.Contains(string(b), `"utilization_missing":"MIG"`) {
		t.Errorf("unknown: %s", b)
	}
}
