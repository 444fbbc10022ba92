package nvml

import (
	"fmt"
	"reflect"
	"testing"
)

// equalBase has every field set, each slice one element long.
func equalBase() Snapshot {
	p := Process{PID: 7, UsedBytes: 1 << 30, UsedKnown: true, GPUInstanceID: 1, ComputeInstanceID: 2,
		Util: Utilization{Known: true, SMPercent: 3, MemoryPercent: 4, SampledAt: 5}}
	return Snapshot{Simulated: true, Warnings: []string{"w"}, Devices: []Device{{
		Index: 1, UUID: "GPU-1", Name: "H200", MemoryTotalBytes: 80 << 30, MemoryUsedBytes: 2 << 30,
		MemoryReservedBytes: 1 << 20, DriverVersion: "580", Simulated: true, MIGEnabled: true,
		MIG: []MIGInstance{{UUID: "MIG-1", GPUInstanceID: 1, ComputeInstanceID: 2, MemoryTotalBytes: 10 << 30,
			MemoryUsedBytes: 1 << 30, Processes: []Process{p}}},
		Processes: []Process{p}, UtilizationMissing: "MIG",
	}}}
}

// leaves calls f with the path of every field that is not a struct or a
// slice, and of every slice (as "path[]"), in v.
func leaves(v reflect.Value, path string, f func(path string, v reflect.Value)) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			leaves(v.Field(i), path+"."+v.Type().Field(i).Name, f)
		}
	case reflect.Slice:
		f(path+"[]", v)
		for i := range v.Len() {
			leaves(v.Index(i), fmt.Sprintf("%s[%d]", path, i), f)
		}
	default:
		f(path, v)
	}
}

// change sets v to another value of its kind; false for a kind it does
// not know (the test then fails: Equal must learn it).
func change(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint8, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Slice:
		v.Set(v.Slice(0, 0)) // one element fewer
	default:
		return false
	}
	return true
}

// Equal tells two snapshots apart whatever field differs, at any depth
// (each field of each type is changed in turn, a slice made shorter), so
// that a field added later and not compared fails here; and it agrees
// with reflect.DeepEqual, which it replaces, on each of them.
func TestEqualSeesEveryField(t *testing.T) {
	if a, b := equalBase(), equalBase(); !a.Equal(b) {
		t.Fatal("a snapshot differs from its copy")
	}
	if a, b := (Snapshot{}), (Snapshot{Devices: []Device{}, Warnings: []string{}}); !a.Equal(b) {
		t.Error("nil and empty slices differ")
	}
	var paths []string
	leaves(reflect.ValueOf(equalBase()), "Snapshot", func(path string, _ reflect.Value) { paths = append(paths, path) })
	if len(paths) < 30 {
		t.Fatalf("only %d fields walked: %v", len(paths), paths)
	}
	for i, path := range paths {
		base, changed := equalBase(), equalBase()
		n := 0
		leaves(reflect.ValueOf(&changed).Elem(), "Snapshot", func(_ string, v reflect.Value) {
			if n == i && !change(v) {
				t.Errorf("%s: a field of kind %s: teach Equal and this test to compare it", path, v.Kind())
			}
			n++
		})
		if base.Equal(changed) || changed.Equal(base) {
			t.Errorf("%s changed, and Equal says the snapshots are equal", path)
		}
		if reflect.DeepEqual(base, changed) {
			t.Errorf("%s: the test changed nothing", path)
		}
	}
}
