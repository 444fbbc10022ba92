package attribution_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/oom"
	"github.com/gpumem/gpumem/sidecar/procs"
)

var update = flag.Bool("update", false, "rewrite testdata/report/*.json at the repository's root")

// goldenDir is where the golden report lies: at the repository's root,
// where the TypeScript and Python tests read it too.
var goldenDir = filepath.Join("..", "..", "testdata", "report")

// goldenAt is the golden report's clock.
var goldenAt = time.Date(2026, 3, 2, 14, 0, 0, 0, time.UTC)

const (
	gib = 1 << 30
	mib = 1 << 20
)

func goldenProc(pid, ppid int, start uint64, user string, argv ...string) procs.Proc {
	return procs.Proc{PID: pid, PPID: ppid, PGID: ppid, SID: ppid, StartTime: start, Comm: "python3", Detailed: true,
		User: user, Argv: argv, NSpid: []int{pid}}
}

func goldenGPUProc(pid int, used uint64, sm, mem uint32) nvml.Process {
	return nvml.Process{PID: pid, UsedBytes: used, UsedKnown: true, GPUInstanceID: nvml.NoInstance,
		ComputeInstanceID: nvml.NoInstance, Util: nvml.Utilization{Known: true, SMPercent: sm, MemoryPercent: mem}}
}

// unknownUtil is p on a GPU that cannot say its processes' utilization.
func unknownUtil(p nvml.Process) nvml.Process {
	p.Util = nvml.Utilization{}
	return p
}

// goldenPods puts every process of alice's in her JupyterHub pod.
type goldenPods struct{}

func (goldenPods) PodOf(pid int, _ uint64) (attribution.Pod, bool) {
	switch pid {
	case 100, 101, 200:
		return attribution.Pod{Name: "jupyter-alice", Namespace: "hub", UID: "0f6c2d1e-pod-alice", Container: "notebook",
			User: "alice", Server: "gpu"}, true
	case 400:
		return attribution.Pod{Name: "serve-7d9f", Namespace: "inference", UID: "5b1a-pod-serve"}, true
	}
	return attribution.Pod{}, false
}

// goldenInputs are the golden report's: three users' notebooks on two
// GPUs (alice's training with a DataLoader worker's stray context and an
// evaluation, bob's notebook with a stray context on the GPU it does not
// use, dave's kernel without a notebook path), carol's server process of
// no kernel, and a process NVML cannot size.
func goldenInputs() (nvml.Snapshot, *procs.Table, []attribution.Kernel) {
	table := procs.NewTable([]procs.Proc{
		goldenProc(1, 0, 1, "root", "/sbin/init"),
		goldenProc(100, 1, 1000, "alice", "python3", "-m", "ipykernel_launcher", "-f", "/run/user/1000/jupyter/kernel-a.json"),
		goldenProc(101, 100, 1001, "alice", "python3", "-c", "from multiprocessing.spawn import spawn_main"),
		goldenProc(200, 1, 2000, "alice", "python3", "-m", "ipykernel_launcher", "-f", "/run/user/1000/jupyter/kernel-b.json"),
		goldenProc(300, 1, 3000, "bob", "python3", "-m", "ipykernel_launcher", "-f", "/run/user/1001/jupyter/kernel-c.json"),
		goldenProc(400, 1, 4000, "carol", "python3", "serve.py", "--port", "8000"),
		goldenProc(500, 1, 5000, "dave", "python3", "-m", "ipykernel_launcher", "-f", "/run/user/1003/jupyter/kernel-d.json"),
	})
	snap := nvml.Snapshot{Devices: []nvml.Device{
		{Index: 0, UUID: "GPU-0a1b", Name: "NVIDIA H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 70 * gib,
			MemoryReservedBytes: 512 * mib, Processes: []nvml.Process{
				goldenGPUProc(100, 40*gib, 0, 0), goldenGPUProc(101, 500*mib, 0, 0),
				goldenGPUProc(300, 16*gib, 93, 41), goldenGPUProc(400, 8*gib, 12, 3), goldenGPUProc(500, 4*gib, 0, 0)}},
		{Index: 1, UUID: "GPU-1c2d", Name: "NVIDIA H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 12*gib + 518*mib,
			UtilizationMissing: "per-process utilization is not supported on this GPU",
			Processes: []nvml.Process{unknownUtil(goldenGPUProc(200, 12*gib, 0, 0)), unknownUtil(goldenGPUProc(300, 518*mib, 0, 0)),
				{PID: 400, GPUInstanceID: nvml.NoInstance, ComputeInstanceID: nvml.NoInstance}}},
	}}
	kernels := []attribution.Kernel{
		{ID: "4c1f2e0a-6b7d-4e21-9a3c-1d2e3f405162", ConnectionFile: "/run/user/1000/jupyter/kernel-a.json",
			Notebook: "/home/alice/train.ipynb", PID: 100, StartTime: 1000},
		{ID: "9d00be11-2c3d-4e5f-8a9b-0c1d2e3f4a5b", ConnectionFile: "/run/user/1000/jupyter/kernel-b.json",
			Notebook: "/home/alice/eval.ipynb", PID: 200, StartTime: 2000},
		{ID: "b0b0b0b0-1111-4222-8333-444455556666", ConnectionFile: "/run/user/1001/jupyter/kernel-c.json",
			Notebook: "/home/bob/finetune.ipynb", PID: 300, StartTime: 3000},
		{ID: "da7eda7e-0000-4000-8000-000000000001", ConnectionFile: "/run/user/1003/jupyter/kernel-d.json", PID: 500, StartTime: 5000},
	}
	return snap, table, kernels
}

// goldenReport is a finished report with every optional part filled, as
// gpumem serve finishes its samples: what the daemon judges itself (peaks,
// compute verdicts, processes left running, hoarding) given to Finish.
func goldenReport() attribution.Report {
	snap, table, kernels := goldenInputs()
	rep := attribution.MakeReport(snap, table, kernels)
	attribution.AddUtilization(&rep, snap)
	rep.Warnings = []string{"server http://127.0.0.1:8889/: GET /api/sessions: 403 Forbidden (its token is not in its server file)"}
	hoarded, userHoarded := 12.5, 31.25
	peaks := map[string]uint64{}
	compute := &attribution.ComputeFacts{Kernels: map[string]attribution.Compute{}}
	for i, nb := range rep.Notebooks {
		peaks[nb.ConnectionFile] = nb.GPUMemoryBytes + 2*gib
		switch {
		case i == len(rep.Notebooks)-1:
			compute.Kernels[nb.ConnectionFile] = attribution.Compute{State: attribution.ComputeUnknown,
				Reason: "GPU utilization unknown in 120 of 120 readings"}
		case nb.User == "alice" || nb.User == "dave":
			compute.Kernels[nb.ConnectionFile] = attribution.Compute{State: attribution.ComputeIdle,
				Reason:         "120 readings, 0 at or above 5% SM or memory, in the last 10 min",
				LastComputedAt: goldenAt.Add(-3 * time.Hour), HoardedGiBHours: &hoarded}
		case nb.User == "bob":
			compute.Kernels[nb.ConnectionFile] = attribution.Compute{State: attribution.ComputeComputing,
				Reason: "118 readings at or above 5% SM or memory in the last 10 min", LastComputedAt: goldenAt.Add(-time.Second)}
		}
	}
	compute.LeftRunning = []attribution.LeftRunning{{KernelID: "4c1f2e0a-6b7d-4e21-9a3c-1d2e3f405162",
		ConnectionFile: "/run/user/1000/jupyter/kernel-old.json", Notebook: "/home/alice/train.ipynb", User: "alice",
		PID: 777, StartTime: 7770, Command: "python train.py", GPUs: []int{0}, Bytes: 20 * gib, Reason: attribution.ComputeComputing,
		Since:   goldenAt.Add(-20 * time.Minute),
		Message: "a job started from train.ipynb (pid 777, `python train.py`) is still computing on GPU 0 with 20.0 GiB: left running"}}
	compute.Hoarding = []attribution.UserHoarding{{User: "alice", GiBHours: userHoarded, WindowSeconds: 86400},
		{User: "dave", GiBHours: hoarded, WindowSeconds: 86400}, {User: "bob", GiBHours: 0, WindowSeconds: 86400}}
	prev := rep // the sample before: the stray contexts were there already
	attribution.Finish(&prev, attribution.FinishInput{Now: goldenAt.Add(-time.Second), Table: table})
	lastGPU := 1
	attribution.Finish(&rep, attribution.FinishInput{
		Now: goldenAt, Table: table, Pods: goldenPods{}, Previous: &prev,
		Evidence: map[string]attribution.FrameworkEvidence{"/run/user/1001/jupyter/kernel-c.json": {PID: 300,
			Held: map[int]uint64{0: 15 * gib}, DriverAt: map[int]uint64{0: 16 * gib, 1: 518 * mib}}},
		OOM: map[string]attribution.OOMSummary{"/run/user/1000/jupyter/kernel-b.json": {Count: 2,
			LastTime: goldenAt.Add(-5 * time.Minute).Unix(), LastGPU: &lastGPU, LastRequestedBytes: 20 * gib, LastEvent: 41,
			LastHeadline: "Out of memory in eval.ipynb, cell [7]: asked for 20.0 GiB on GPU 1 (67.5 GiB free)"}},
		Kernels: map[string]attribution.KernelActivity{
			"/run/user/1000/jupyter/kernel-a.json": {ExecutionState: "idle", LastActivity: goldenAt.Add(-3*time.Hour - 5*time.Minute)},
			"/run/user/1000/jupyter/kernel-b.json": {ExecutionState: "idle", LastActivity: goldenAt.Add(-10 * time.Minute),
				ComputedAt: goldenAt.Add(-90 * time.Second)},
			"/run/user/1001/jupyter/kernel-c.json": {ExecutionState: "idle", LastActivity: goldenAt.Add(-time.Minute), ShellBusy: true},
		},
		Culls: []attribution.CullWarning{{KernelID: "4c1f2e0a-6b7d-4e21-9a3c-1d2e3f405162",
			ConnectionFile: "/run/user/1000/jupyter/kernel-a.json", User: "alice", Warning: 1,
			Deadline: goldenAt.Add(5 * time.Minute), Action: attribution.CullShutdown, Bytes: 40*gib + 500*mib,
			Idle: 3*time.Hour + 5*time.Minute}},
		Alerts:  attribution.AlertConfig{Threshold: 0.8, Episodes: map[int]int{0: 2, 1: 1}}, // GPU 1 back under
		Compute: compute, Peaks: peaks,
	})
	return rep
}

// goldenOOM is the out-of-memory event the daemon assesses from the
// golden report for alice's evaluation notebook on GPU 1.
func goldenOOM(rep attribution.Report) oom.Event {
	ordinal := 0
	visible := "1"
	req := oom.Request{Framework: "torch", Error: "torch.OutOfMemoryError",
		Message:        "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 67.12 GiB is free.",
		RequestedBytes: 20 * gib, Device: oom.Device{Ordinal: &ordinal, UUID: "GPU-1c2d", VisibleDevices: &visible},
		Cell: oom.Cell{ExecutionCount: 7, Line: 3, Source: "logits = model(batch.to('cuda'))"},
		Kernel: oom.Kernel{AllocatedBytes: 9 * gib, ReservedBytes: 11 * gib, ReleasableBytes: gib, FragmentedBytes: gib,
			IPythonBytes: 2 * gib, IPythonRefs: []string{"Out[5]"}, TracebackBytes: gib,
			Variables: []oom.Holding{{Name: "model", Bytes: 6 * gib}, {Name: "batch", Bytes: 512 * mib}}}}
	ev := oom.Assess(rep, "9d00be11-2c3d-4e5f-8a9b-0c1d2e3f4a5b", "/run/user/1000/jupyter/kernel-b.json", req,
		goldenAt.Add(-time.Second), goldenAt)
	ev.Seq = 41
	return ev
}

// TestGoldenReport pins the finished report's JSON, the contract every
// face reads, to testdata/report/golden-report.json (and the
// out-of-memory event assessed from it to golden-oom.json): the
// TypeScript and Python tests read those files, so a field renamed here
// fails them. -update rewrites them.
func TestGoldenReport(t *testing.T) {
	rep := goldenReport()
	checkGoldenComplete(t, rep)
	for name, v := range map[string]any{"golden-report.json": rep, "golden-oom.json": goldenOOM(rep)} {
		got, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, '\n')
		path := filepath.Join(goldenDir, name)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (go test ./sidecar/attribution -run Golden -update writes it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what Go writes now: go test -p 1 ./sidecar/attribution ./sidecar/api -run Golden -update "+
				"rewrites it (and the own view of it), "+
				"then the TypeScript and Python tests say what their readers make of it; a field renamed or removed "+
				"bumps attribution.ReportSchema.\n--- got ---\n%s", path, got)
		}
	}
}

// checkGoldenComplete fails unless every field of the report's types
// appears in the golden report (at its place), and every kind of alert,
// holder, compute state and stray context: the other languages' tests
// check only what the file holds.
func checkGoldenComplete(t *testing.T, rep attribution.Report) {
	t.Helper()
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	collectKeys(doc, "report", seen)
	// A type's field counts where any of its places holds it (a user's
	// totals per GPU carry no utilization, other GPUBytes do).
	covered := map[string]bool{}
	var fields []string
	for _, k := range typeKeys(reflect.TypeOf(rep), "report", nil) {
		if !slices.Contains(fields, k.field) {
			fields = append(fields, k.field)
		}
		covered[k.field] = covered[k.field] || seen[k.path]
	}
	for _, f := range fields {
		// View is the API's own view's ("own"), never Finish's: sidecar/api's
		// TestGoldenOwnView writes alice's view of this report beside it.
		if !covered[f] && f != "Report.view" {
			t.Errorf("the golden report has no %s: fill it in goldenReport, so the other languages' tests read it", f)
		}
	}
	kinds := map[string]bool{}
	for _, a := range rep.Alerts {
		kinds["alert "+a.Kind] = true
	}
	for _, g := range rep.GPUs {
		for _, h := range append(g.Holders, g.HoldersByUser...) {
			kinds["holder "+h.Kind] = true
		}
	}
	for _, nb := range rep.Notebooks {
		if nb.Compute != nil {
			kinds["compute "+nb.Compute.State] = true
		}
		for _, sc := range nb.StrayContexts {
			kinds["stray "+sc.Cause] = true
		}
	}
	for _, k := range []string{"alert " + attribution.AlertThreshold, "alert " + attribution.AlertCull,
		"alert " + attribution.AlertLeftRunning, "alert " + attribution.AlertOOM,
		"holder " + attribution.HolderNotebook, "holder " + attribution.HolderProcess, "holder " + attribution.HolderUser,
		"compute " + attribution.ComputeComputing, "compute " + attribution.ComputeIdle, "compute " + attribution.ComputeUnknown,
		"stray default_device", "stray idle_child"} {
		if !kinds[k] {
			t.Errorf("the golden report has no %s: fill it in goldenReport", k)
		}
	}
}

// collectKeys records every object key of doc by its path ("report.gpus[].holders[].kind").
func collectKeys(doc any, path string, seen map[string]bool) {
	switch v := doc.(type) {
	case map[string]any:
		for k, e := range v {
			seen[path+"."+k] = true
			collectKeys(e, path+"."+k, seen)
		}
	case []any:
		for _, e := range v {
			collectKeys(e, path+"[]", seen)
		}
	}
}

// typeKey is a field's JSON key at one of its places in the report.
type typeKey struct {
	field string // "Holder.kind"
	path  string // "report.gpus[].holders[].kind", as collectKeys names it
}

// typeKeys lists the JSON keys of t's fields at their places; visiting
// guards against recursive types.
func typeKeys(t reflect.Type, path string, visiting map[reflect.Type]bool) []typeKey {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice {
			path += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeOf(time.Time{}) || visiting[t] {
		return nil
	}
	if visiting == nil {
		visiting = map[reflect.Type]bool{}
	}
	visiting[t] = true
	defer delete(visiting, t)
	var keys []typeKey
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		keys = append(keys, typeKey{t.Name() + "." + name, path + "." + name})
		keys = append(keys, typeKeys(f.Type, path+"."+name, visiting)...)
	}
	return keys
}
