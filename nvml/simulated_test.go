package nvml

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func openSimulated(t *testing.T, path string) *Source {
	t.Helper()
	src, err := OpenSimulated(path)
	if err != nil {
		t.Fatalf("OpenSimulated: %v", err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

func sample(t *testing.T, src *Source) Snapshot {
	t.Helper()
	snap, err := src.Sample(context.Background())
	if err != nil {
		t.Fatalf("Sample: %v", err)
	}
	return snap
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSimulatedRereadEachSample(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.json")
	writeFile(t, path, `{"gpus":[{"name":"A","uuid":"GPU-A","memory_total_bytes":100,"processes":[{"pid":1,"used_bytes":10}]}]}`)
	src := openSimulated(t, path)
	if got := sample(t, src).Devices[0].MemoryUsedBytes; got != 10 {
		t.Fatalf("used = %d, want 10", got)
	}
	writeFile(t, path, `{"gpus":[{"name":"A","uuid":"GPU-A","memory_total_bytes":100,"processes":[{"pid":1,"used_bytes":10},{"pid":2,"used_bytes":30}]}]}`)
	snap := sample(t, src)
	if got := snap.Devices[0].MemoryUsedBytes; got != 40 || len(snap.Devices[0].Processes) != 2 {
		t.Fatalf("after rewrite: used = %d, processes %+v", got, snap.Devices[0].Processes)
	}
	writeFile(t, path, `{"gpus":[`)
	_, err := src.Sample(context.Background())
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("malformed after OpenSimulated: err = %v, want one naming %s", err, path)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Sample(context.Background()); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Fatalf("removed file: err = %v", err)
	}
}

// A file read again with the same bytes is not parsed again; any change
// is seen at the next sample, one of the same size written within the
// clock's tick (mtime and size unchanged) too, and a file that was
// malformed in between is parsed again.
func TestSimulatedUnchangedBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.json")
	gpu := func(pid, used int) string {
		return fmt.Sprintf(`{"gpus":[{"memory_total_bytes":100,"processes":[{"pid":%d,"used_bytes":%d}]}]}`, pid, used)
	}
	writeFile(t, path, gpu(1, 10))
	src := openSimulated(t, path)
	first, again := sample(t, src), sample(t, src)
	if !first.Equal(again) || len(again.Devices[0].Processes) != 1 {
		t.Fatalf("read again: %+v, first %+v", again, first)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct{ pid, used int }{{2, 10}, {2, 20}, {1, 10}} {
		writeFile(t, path, gpu(want.pid, want.used))
		p := sample(t, src).Devices[0].Processes[0]
		if p.PID != want.pid || p.UsedBytes != uint64(want.used) {
			t.Fatalf("rewrite %d (same size): %+v, want pid %d, %d bytes", i, p, want.pid, want.used)
		}
	}
	if after, err := os.Stat(path); err == nil && after.Size() != before.Size() {
		t.Fatalf("the rewrites changed the size: %d, then %d", before.Size(), after.Size())
	}
	writeFile(t, path, `{"gpus":[`)
	if _, err := src.Sample(context.Background()); err == nil {
		t.Fatal("malformed: no error")
	}
	writeFile(t, path, gpu(1, 10))
	if got := sample(t, src); !got.Equal(first) {
		t.Fatalf("after the malformed file, the first again: %+v, want %+v", got, first)
	}
}

func TestSimulatedMalformed(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    string // substring of the error, after the file name
	}{
		{"empty", ``, "the file is empty"},
		{"syntax error with position", "{\"gpus\": [\n  {\"memory_total_bytes\": 10,\n   \"processes\": [{\"pid\": 1, \"used_bytes\": 2},]}]}",
			"line 3, column 47: invalid character ']'"},
		{"truncated", "{\"gpus\": [\n", "line 2, column 1: unexpected EOF"},
		{"wrong type", `{"gpus":[{"memory_total_bytes":"80GB"}]}`, "line 1, column 38: json: cannot unmarshal string into Go struct field"},
		{"negative bytes", `{"gpus":[{"memory_total_bytes":-1}]}`, "cannot unmarshal number -1"},
		{"unknown field", `{"gpus":[{"memory_total":10}]}`, `unknown field "memory_total"`},
		{"no gpus", `{}`, `missing "gpus"`},
		{"gpus not a list", `{"gpus":{}}`, "cannot unmarshal object"},
		{"missing total", `{"gpus":[{"name":"x","uuid":"u"}]}`, `gpus[0]: missing "memory_total_bytes"`},
		{"missing pid", `{"gpus":[{"memory_total_bytes":10},{"memory_total_bytes":10,"processes":[{"used_bytes":1}]}]}`,
			`gpus[1]: processes[0]: missing "pid"`},
		{"missing used", `{"gpus":[{"memory_total_bytes":10,"processes":[{"pid":3}]}]}`, `gpus[0]: processes[0]: missing "used_bytes"`},
		{"zero pid", `{"gpus":[{"memory_total_bytes":10,"processes":[{"pid":0,"used_bytes":1}]}]}`, "pid 0 is not a process id"},
		{"duplicate pid", `{"gpus":[{"memory_total_bytes":10,"processes":[{"pid":3,"used_bytes":1},{"pid":3,"used_bytes":1}]}]}`, "pid 3 is listed twice"},
		{"processes exceed total", `{"gpus":[{"memory_total_bytes":10,"processes":[{"pid":3,"used_bytes":6},{"pid":4,"used_bytes":6}]}]}`,
			"processes use more than memory_total_bytes (10)"},
		{"used exceeds total", `{"gpus":[{"memory_total_bytes":10,"memory_used_bytes":11}]}`, "memory_used_bytes 11 exceeds memory_total_bytes 10"},
		{"trailing data", `{"gpus":[]} {"gpus":[]}`, "line 1, column 13: unexpected data after the JSON object"},
		{"sm over 100", `{"gpus":[{"memory_total_bytes":10,"processes":[{"pid":3,"used_bytes":1,"sm_percent":101}]}]}`,
			"gpus[0]: processes[0]: sm_percent 101 is not a percentage (0 to 100)"},
		{"negative memory percent", `{"gpus":[{"memory_total_bytes":10,"processes":[{"pid":3,"used_bytes":1,"memory_percent":-1}]}]}`,
			"cannot unmarshal number -1"},
		{"utilization on a GPU without it", `{"gpus":[{"memory_total_bytes":10,"process_utilization":false,"processes":[{"pid":3,"used_bytes":1,"sm_percent":5}]}]}`,
			`processes[0]: sm_percent or memory_percent given on a GPU with "process_utilization": false`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fake-gpu.json")
			writeFile(t, path, tt.content)
			_, err := OpenSimulated(path)
			if err == nil {
				t.Fatal("OpenSimulated succeeded, want an error")
			}
			prefix := "simulated GPU file " + path + " (GPUMEM_FAKE_GPU): "
			if !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %q\nwant prefix %q and %q", err, prefix, tt.want)
			}
		})
	}
}

func TestSimulatedMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.json")
	_, err := OpenSimulated(path)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "GPUMEM_FAKE_GPU") {
		t.Fatalf("err = %v", err)
	}
}

func TestLineCol(t *testing.T) {
	data := []byte("ab\ncd\n\nef")
	tests := []struct {
		off       int64
		line, col int
	}{{0, 1, 1}, {1, 1, 2}, {2, 1, 3}, {3, 2, 1}, {6, 3, 1}, {7, 4, 1}, {9, 4, 3}, {99, 4, 3}, {-5, 1, 1}}
	for _, tt := range tests {
		if l, c := lineCol(data, tt.off); l != tt.line || c != tt.col {
			t.Errorf("lineCol(%d) = %d:%d, want %d:%d", tt.off, l, c, tt.line, tt.col)
		}
	}
}

// Utilization: sm_percent and memory_percent are read; a process without
// them computes nothing (files from before utilization mean what they
// meant); a GPU with "process_utilization": false knows nothing of it.
func TestSimulatedUtilization(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.json")
	writeFile(t, path, `{"gpus":[
	  {"memory_total_bytes":100,"processes":[{"pid":1,"used_bytes":10,"sm_percent":97,"memory_percent":12},{"pid":2,"used_bytes":10}]},
	  {"memory_total_bytes":100,"process_utilization":false,"processes":[{"pid":3,"used_bytes":10}]}]}`)
	snap := sample(t, openSimulated(t, path))
	d0, d1 := snap.Devices[0], snap.Devices[1]
	if d0.UtilizationMissing != "" {
		t.Errorf("GPU 0: UtilizationMissing = %q, want known", d0.UtilizationMissing)
	}
	if got, want := d0.Processes[0].Util, (Utilization{Known: true, SMPercent: 97, MemoryPercent: 12}); got != want {
		t.Errorf("pid 1: %+v, want %+v", got, want)
	}
	if got, want := d0.Processes[1].Util, (Utilization{Known: true}); got != want {
		t.Errorf("pid 2 (no figures given): %+v, want known 0", got)
	}
	if d1.UtilizationMissing == "" || d1.Processes[0].Util.Known {
		t.Errorf("GPU 1: missing %q, pid 3 %+v: want unknown", d1.UtilizationMissing, d1.Processes[0].Util)
	}
}
