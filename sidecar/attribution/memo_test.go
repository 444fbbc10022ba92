package attribution

import (
	"reflect"
	"testing"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// A Memo answers as Attribute does; from memory while the inputs stay the
// same (the kernels in any order), and again when any of them changes.
func TestMemo(t *testing.T) {
	snap := func(b uint64) nvml.Snapshot {
		return nvml.Snapshot{Devices: []nvml.Device{device(0, 80*gib, 9*gib, gpuProc(101, b), gpuProc(200, gib), gpuProc(300, 2*gib))}}
	}
	table := procs.NewTable(box)
	kernels := []Kernel{kernelA, kernelB}
	var m Memo
	first := m.Attribute(snap(3*gib), table, kernels)
	if want := Attribute(snap(3*gib), table, kernels); !reflect.DeepEqual(first, want) {
		t.Fatalf("memo: %+v\nwant %+v", first, want)
	}
	first.Notebooks[0].User = "changed by the caller"
	again := m.Attribute(snap(3*gib), table, []Kernel{kernelB, kernelA})
	if again.Notebooks[0].User == "changed by the caller" {
		t.Errorf("a caller's change to one report shows in the next")
	}
	if &again.Notebooks[0].PIDs[0] != &first.Notebooks[0].PIDs[0] {
		t.Errorf("the same inputs (kernels in another order) were attributed again")
	}
	// Each input changed alone: attributed again.
	prev, other := again, procs.NewTable(box)
	for _, step := range []struct {
		name    string
		snap    nvml.Snapshot
		table   *procs.Table
		kernels []Kernel
	}{
		{"bytes", snap(4 * gib), table, kernels},
		{"table", snap(4 * gib), other, kernels},
		{"kernels", snap(4 * gib), other, []Kernel{kernelA, {ID: "cccc", PID: 300, StartTime: 3000}}},
	} {
		next := m.Attribute(step.snap, step.table, step.kernels)
		if &next.Notebooks[0].PIDs[0] == &prev.Notebooks[0].PIDs[0] {
			t.Errorf("%s changed: the report came from memory", step.name)
		}
		prev = next
	}
	changed := m.Attribute(snap(5*gib), table, kernels)
	if want := Attribute(snap(5*gib), table, kernels); !reflect.DeepEqual(changed, want) {
		t.Errorf("after a change: %+v\nwant %+v", changed, want)
	}
}
