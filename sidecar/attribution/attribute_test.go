package attribution

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/procs"
)

const (
	mib = 1 << 20
	gib = 1 << 30
)

// proc builds a detailed process; sid and pgid default to the parent's
// conventions of the test (given explicitly where they matter).
func proc(pid, ppid, pgid, sid int, start uint64, user string, argv ...string) procs.Proc {
	return procs.Proc{PID: pid, PPID: ppid, PGID: pgid, SID: sid, StartTime: start, Comm: "python3",
		Detailed: true, User: user, Argv: argv, NSpid: []int{pid}}
}

func gpuProc(pid int, used uint64) nvml.Process {
	return nvml.Process{PID: pid, UsedBytes: used, UsedKnown: true, GPUInstanceID: nvml.NoInstance, ComputeInstanceID: nvml.NoInstance}
}

func unknownProc(pid int) nvml.Process {
	return nvml.Process{PID: pid, GPUInstanceID: nvml.NoInstance, ComputeInstanceID: nvml.NoInstance}
}

func device(index int, total, used uint64, ps ...nvml.Process) nvml.Device {
	return nvml.Device{Index: index, UUID: "GPU-" + string(rune('a'+index)), Name: "NVIDIA H200",
		MemoryTotalBytes: total, MemoryUsedBytes: used, Processes: ps}
}

// box: init; kernel A (100, alice) with a DataLoader worker 101 and its
// child 102, a setsid() child 103; kernel B (200, alice) idle; bob's 300.
var box = []procs.Proc{
	proc(1, 0, 1, 1, 1, "root", "/sbin/init"),
	proc(100, 1, 100, 100, 1000, "alice", "python3", "-m", "ipykernel_launcher", "-f", "kernel-a.json"),
	proc(101, 100, 100, 100, 1001, "alice", "python3", "-c", "worker"),
	proc(102, 101, 100, 100, 1002, "alice", "python3", "-c", "grandchild"),
	proc(103, 100, 103, 103, 1003, "alice", "ray::worker"),
	proc(200, 1, 200, 200, 2000, "alice", "python3", "-m", "ipykernel_launcher", "-f", "kernel-b.json"),
	proc(300, 1, 300, 300, 3000, "bob", "python3", "train.py", "--epochs", "10"),
}

var kernelA = Kernel{ID: "aaaaaaaa-1111", Notebook: "/home/alice/a.ipynb", PID: 100, StartTime: 1000}
var kernelB = Kernel{ID: "bbbbbbbb-2222", Notebook: "/home/alice/b.ipynb", PID: 200, StartTime: 2000}

func TestAttribute(t *testing.T) {
	tests := []struct {
		name    string
		snap    nvml.Snapshot
		procs   []procs.Proc
		kernels []Kernel
		want    Report
	}{
		{
			name: "kernel tree on two GPUs, an idle kernel, another user's job",
			snap: nvml.Snapshot{Devices: []nvml.Device{
				device(0, 80*gib, 8*gib, gpuProc(100, 2*gib), gpuProc(102, gib), gpuProc(300, 4*gib)),
				device(1, 80*gib, gib, gpuProc(101, 512*mib), gpuProc(103, 256*mib)),
			}},
			procs:   box,
			kernels: []Kernel{kernelB, kernelA},
			want: Report{
				GPUs: []GPU{
					{Index: 0, UUID: "GPU-a", Name: "NVIDIA H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 8 * gib,
						NotebookBytes: 3 * gib, OtherBytes: 4 * gib, FreeBytes: 72 * gib},
					{Index: 1, UUID: "GPU-b", Name: "NVIDIA H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: gib,
						NotebookBytes: 768 * mib, FreeBytes: 79 * gib},
				},
				Notebooks: []Notebook{
					{KernelID: kernelA.ID, Notebook: kernelA.Notebook, PIDs: []int{100, 101, 102, 103}, User: "alice",
						GPUMemoryBytes: 3*gib + 768*mib, PerGPU: []GPUBytes{{Index: 0, Bytes: 3 * gib}, {Index: 1, Bytes: 768 * mib}}},
					{KernelID: kernelB.ID, Notebook: kernelB.Notebook, PIDs: []int{200}, User: "alice", PerGPU: []GPUBytes{}},
				},
				Other: []OtherProcess{{PID: 300, User: "bob", Command: "python3 train.py --epochs 10", PerGPU: []GPUBytes{{Index: 0, Bytes: 4 * gib}}}},
			},
		},
		{
			name: "orphans of a killed kernel, reparented to init and to a subreaper",
			snap: nvml.Snapshot{Devices: []nvml.Device{device(0, 80*gib, 3*gib, gpuProc(401, gib), gpuProc(403, 2*gib))}},
			procs: []procs.Proc{
				proc(1, 0, 1, 1, 1, "root", "/sbin/init"),
				proc(50, 1, 50, 50, 500, "carol", "/lib/systemd/systemd", "--user"),
				proc(401, 1, 400, 400, 4001, "carol", "python3", "pool-worker"),
				proc(402, 401, 402, 402, 4002, "carol", "idle"),
				proc(403, 50, 400, 400, 4003, "carol", "python3", "cuda-child"),
			},
			kernels: []Kernel{{ID: "cccc", Notebook: "/c.ipynb", PID: 400, StartTime: 4000}},
			want: Report{
				GPUs: []GPU{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 3 * gib,
					NotebookBytes: 3 * gib, FreeBytes: 77 * gib}},
				Notebooks: []Notebook{{KernelID: "cccc", Notebook: "/c.ipynb", PIDs: []int{400, 401, 403}, User: "carol",
					GPUMemoryBytes: 3 * gib, PerGPU: []GPUBytes{{Index: 0, Bytes: 3 * gib}}}},
				Other: []OtherProcess{},
			},
		},
		{
			name: "a reused kernel pid is not the kernel",
			snap: nvml.Snapshot{Devices: []nvml.Device{device(0, 10*gib, gib, gpuProc(500, gib))}},
			procs: []procs.Proc{
				proc(1, 0, 1, 1, 1, "root", "/sbin/init"),
				proc(500, 1, 500, 500, 9000, "dave", "other", "job"),
			},
			kernels: []Kernel{{ID: "dddd", Notebook: "/d.ipynb", PID: 500, StartTime: 5000}},
			want: Report{
				GPUs: []GPU{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H200", MemoryTotalBytes: 10 * gib, MemoryUsedBytes: gib,
					OtherBytes: gib, FreeBytes: 9 * gib}},
				Notebooks: []Notebook{{KernelID: "dddd", Notebook: "/d.ipynb", PIDs: []int{500}, PerGPU: []GPUBytes{}}},
				Other:     []OtherProcess{{PID: 500, User: "dave", Command: "other job", PerGPU: []GPUBytes{{Index: 0, Bytes: gib}}}},
			},
		},
		{
			name:    "unknown memory: listed with 0 bytes and flagged",
			snap:    nvml.Snapshot{Devices: []nvml.Device{device(0, 80*gib, 5*gib, unknownProc(101), gpuProc(100, gib), unknownProc(300))}},
			procs:   box,
			kernels: []Kernel{kernelA},
			want: Report{
				GPUs: []GPU{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 5 * gib,
					NotebookBytes: gib, FreeBytes: 75 * gib}},
				Notebooks: []Notebook{{KernelID: kernelA.ID, Notebook: kernelA.Notebook, PIDs: []int{100, 101}, User: "alice",
					GPUMemoryBytes: gib, PerGPU: []GPUBytes{{Index: 0, Bytes: gib, BytesUnknown: true}}}},
				Other: []OtherProcess{{PID: 300, User: "bob", Command: "python3 train.py --epochs 10",
					PerGPU: []GPUBytes{{Index: 0, BytesUnknown: true}}}},
			},
		},
		{
			name: "a kernel started from a kernel: each process to its nearest kernel",
			snap: nvml.Snapshot{Devices: []nvml.Device{device(0, 80*gib, 3*gib, gpuProc(601, gib), gpuProc(611, 2*gib))}},
			procs: []procs.Proc{
				proc(1, 0, 1, 1, 1, "root", "/sbin/init"),
				proc(600, 1, 600, 600, 6000, "erin", "outer-kernel"),
				proc(601, 600, 600, 600, 6001, "erin", "outer-child"),
				proc(610, 600, 610, 610, 6010, "erin", "inner-kernel"),
				proc(611, 610, 610, 610, 6011, "erin", "inner-child"),
			},
			kernels: []Kernel{{ID: "outer", PID: 600, StartTime: 6000}, {ID: "inner", PID: 610, StartTime: 6010}},
			want: Report{
				GPUs: []GPU{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 3 * gib,
					NotebookBytes: 3 * gib, FreeBytes: 77 * gib}},
				Notebooks: []Notebook{
					{KernelID: "inner", PIDs: []int{610, 611}, User: "erin", GPUMemoryBytes: 2 * gib, PerGPU: []GPUBytes{{Index: 0, Bytes: 2 * gib}}},
					{KernelID: "outer", PIDs: []int{600, 601}, User: "erin", GPUMemoryBytes: gib, PerGPU: []GPUBytes{{Index: 0, Bytes: gib}}},
				},
				Other: []OtherProcess{},
			},
		},
		{
			name: "pid namespaces: NVML's inner pid maps through NSpid; a pid nowhere is other, with a warning",
			snap: nvml.Snapshot{Devices: []nvml.Device{device(0, 80*gib, 3*gib, gpuProc(8, gib), gpuProc(99999, 2*gib))}},
			procs: []procs.Proc{
				proc(1, 0, 1, 1, 1, "root", "/sbin/init"),
				{PID: 5001, PPID: 1, PGID: 5001, SID: 5001, StartTime: 50, Detailed: true, User: "frank", Argv: []string{"kernel"}, NSpid: []int{5001, 7}},
				{PID: 5002, PPID: 5001, PGID: 5001, SID: 5001, StartTime: 51, Detailed: true, User: "frank", Argv: []string{"child"}, NSpid: []int{5002, 8}},
			},
			kernels: []Kernel{{ID: "ns", Notebook: "/ns.ipynb", PID: 7, StartTime: 50}},
			want: Report{
				GPUs: []GPU{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 3 * gib,
					NotebookBytes: gib, OtherBytes: 2 * gib, FreeBytes: 77 * gib}},
				Notebooks: []Notebook{{KernelID: "ns", Notebook: "/ns.ipynb", PIDs: []int{7, 8}, User: "frank",
					GPUMemoryBytes: gib, PerGPU: []GPUBytes{{Index: 0, Bytes: gib}}}},
				Other:    []OtherProcess{{PID: 99999, PerGPU: []GPUBytes{{Index: 0, Bytes: 2 * gib}}}},
				Warnings: []string{"GPU processes not found in /proc (exited since, or in a pid namespace this /proc does not show): pids 99999"},
			},
		},
		{
			name: "MIG: one process on two instances of a GPU is summed",
			snap: nvml.Snapshot{Devices: []nvml.Device{{Index: 0, UUID: "GPU-m", Name: "NVIDIA H100", MemoryTotalBytes: 80 * gib,
				MemoryUsedBytes: 3 * gib, MIGEnabled: true, Processes: []nvml.Process{
					{PID: 101, UsedBytes: gib, UsedKnown: true, GPUInstanceID: 1},
					{PID: 101, UsedBytes: 2 * gib, UsedKnown: true, GPUInstanceID: 2},
				}}}},
			procs:   box,
			kernels: []Kernel{kernelA},
			want: Report{
				GPUs: []GPU{{Index: 0, UUID: "GPU-m", Name: "NVIDIA H100", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 3 * gib,
					NotebookBytes: 3 * gib, FreeBytes: 77 * gib}},
				Notebooks: []Notebook{{KernelID: kernelA.ID, Notebook: kernelA.Notebook, PIDs: []int{100, 101}, User: "alice",
					GPUMemoryBytes: 3 * gib, PerGPU: []GPUBytes{{Index: 0, Bytes: 3 * gib}}}},
				Other: []OtherProcess{},
			},
		},
		{
			name:    "no driver: no GPUs, kernels still listed, the warning carried",
			snap:    nvml.Snapshot{Devices: []nvml.Device{}, Warnings: []string{nvml.NoDriverWarning}},
			procs:   box,
			kernels: []Kernel{kernelA, kernelB},
			want: Report{
				GPUs: []GPU{},
				Notebooks: []Notebook{
					{KernelID: kernelA.ID, Notebook: kernelA.Notebook, PIDs: []int{100}, User: "alice", PerGPU: []GPUBytes{}},
					{KernelID: kernelB.ID, Notebook: kernelB.Notebook, PIDs: []int{200}, User: "alice", PerGPU: []GPUBytes{}},
				},
				Other:    []OtherProcess{},
				Warnings: []string{nvml.NoDriverWarning},
			},
		},
		{
			name: "simulated, reserved memory is not free, notebook path from JPY_SESSION_NAME",
			snap: nvml.Snapshot{Simulated: true, Devices: []nvml.Device{{Index: 0, UUID: "GPU-s", Name: "Simulated GPU",
				MemoryTotalBytes: 10 * gib, MemoryUsedBytes: 2 * gib, MemoryReservedBytes: gib / 2, Simulated: true,
				Processes: []nvml.Process{gpuProc(700, 2*gib)}}}},
			procs: []procs.Proc{
				{PID: 700, PPID: 1, PGID: 700, SID: 700, StartTime: 7, Detailed: true, User: "gina", SessionName: "work/g.ipynb"},
			},
			kernels: []Kernel{{ID: "gggg", PID: 700}},
			want: Report{
				GPUs: []GPU{{Index: 0, UUID: "GPU-s", Name: "Simulated GPU", MemoryTotalBytes: 10 * gib, MemoryUsedBytes: 2 * gib,
					Simulated: true, NotebookBytes: 2 * gib, FreeBytes: 7*gib + gib/2}},
				Notebooks: []Notebook{{KernelID: "gggg", Notebook: "work/g.ipynb", PIDs: []int{700}, User: "gina",
					GPUMemoryBytes: 2 * gib, PerGPU: []GPUBytes{{Index: 0, Bytes: 2 * gib}}}},
				Other: []OtherProcess{},
			},
		},
		{
			name: "sorting: notebooks by bytes then path, other by bytes then pid",
			snap: nvml.Snapshot{Devices: []nvml.Device{device(0, 80*gib, 10*gib,
				gpuProc(10, gib), gpuProc(20, 3*gib), gpuProc(30, gib), gpuProc(40, gib), gpuProc(41, 2*gib), gpuProc(42, gib))}},
			procs: []procs.Proc{
				proc(10, 1, 10, 10, 10, "u", "k10"), proc(20, 1, 20, 20, 20, "u", "k20"), proc(30, 1, 30, 30, 30, "u", "k30"),
				proc(40, 1, 40, 40, 40, "u", "o40"), proc(41, 1, 41, 41, 41, "u", "o41"), proc(42, 1, 42, 42, 42, "u", "o42"),
			},
			kernels: []Kernel{{ID: "k30", Notebook: "/z.ipynb", PID: 30}, {ID: "k10", Notebook: "/y.ipynb", PID: 10}, {ID: "k20", Notebook: "/x.ipynb", PID: 20}},
			want: Report{
				GPUs: []GPU{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 10 * gib,
					NotebookBytes: 5 * gib, OtherBytes: 4 * gib, FreeBytes: 70 * gib}},
				Notebooks: []Notebook{
					{KernelID: "k20", Notebook: "/x.ipynb", PIDs: []int{20}, User: "u", GPUMemoryBytes: 3 * gib, PerGPU: []GPUBytes{{Index: 0, Bytes: 3 * gib}}},
					{KernelID: "k10", Notebook: "/y.ipynb", PIDs: []int{10}, User: "u", GPUMemoryBytes: gib, PerGPU: []GPUBytes{{Index: 0, Bytes: gib}}},
					{KernelID: "k30", Notebook: "/z.ipynb", PIDs: []int{30}, User: "u", GPUMemoryBytes: gib, PerGPU: []GPUBytes{{Index: 0, Bytes: gib}}},
				},
				Other: []OtherProcess{
					{PID: 41, User: "u", Command: "o41", PerGPU: []GPUBytes{{Index: 0, Bytes: 2 * gib}}},
					{PID: 40, User: "u", Command: "o40", PerGPU: []GPUBytes{{Index: 0, Bytes: gib}}},
					{PID: 42, User: "u", Command: "o42", PerGPU: []GPUBytes{{Index: 0, Bytes: gib}}},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Attribute(tt.snap, procs.NewTable(tt.procs), tt.kernels)
			// The per-process breakdown must add up to the notebook's
			// per-GPU figures, over pids the notebook lists; then it is
			// set aside so the tables stay readable, as are the stray
			// contexts (stray_test.go).
			for i, nb := range got.Notebooks {
				checkProcesses(t, nb)
				got.Notebooks[i].Processes = nil
				got.Notebooks[i].StrayContexts = nil
			}
			if !reflect.DeepEqual(got, tt.want) {
				g, _ := json.MarshalIndent(got, "", "  ")
				w, _ := json.MarshalIndent(tt.want, "", "  ")
				t.Errorf("got\n%s\nwant\n%s", g, w)
			}
		})
	}
}

// checkProcesses checks that nb.Processes breaks nb.PerGPU down exactly.
func checkProcesses(t *testing.T, nb Notebook) {
	t.Helper()
	listed := map[int]bool{}
	for _, pid := range nb.PIDs {
		listed[pid] = true
	}
	sum := map[int]uint64{}
	for _, p := range nb.Processes {
		if !listed[p.PID] {
			t.Errorf("%s: process %d not in pids %v", nb.KernelID, p.PID, nb.PIDs)
		}
		for _, b := range p.PerGPU {
			sum[b.Index] += b.Bytes
		}
	}
	for _, b := range nb.PerGPU {
		if sum[b.Index] != b.Bytes {
			t.Errorf("%s: processes hold %d bytes on GPU %d, notebook %d", nb.KernelID, sum[b.Index], b.Index, b.Bytes)
		}
		delete(sum, b.Index)
	}
	if len(sum) > 0 {
		t.Errorf("%s: processes on GPUs the notebook does not list: %v", nb.KernelID, sum)
	}
}

func TestAttributeWithoutTable(t *testing.T) {
	snap := nvml.Snapshot{Devices: []nvml.Device{device(0, 10*gib, gib, gpuProc(100, gib))}}
	got := Attribute(snap, nil, []Kernel{kernelA})
	if len(got.Other) != 1 || got.Other[0].PID != 100 || got.GPUs[0].OtherBytes != gib {
		t.Errorf("other = %+v", got.Other)
	}
	if len(got.Notebooks) != 1 || got.Notebooks[0].GPUMemoryBytes != 0 {
		t.Errorf("notebooks = %+v", got.Notebooks)
	}
	if len(got.Warnings) != 1 || !strings.Contains(got.Warnings[0], "process table unavailable") {
		t.Errorf("warnings = %q", got.Warnings)
	}
}

// The JSON of the join `gpumem ls --json` prints once finished: keys, and
// empty lists as [] not null. What Finish writes (a notebook's display
// name, a GPU's level) is always written, empty before it.
func TestReportJSON(t *testing.T) {
	snap := nvml.Snapshot{Simulated: true, Devices: []nvml.Device{{Index: 0, UUID: "GPU-s", Name: "Simulated GPU",
		MemoryTotalBytes: 100, MemoryUsedBytes: 30, Simulated: true,
		Processes: []nvml.Process{gpuProc(100, 10), gpuProc(300, 20)}}}}
	got, err := json.Marshal(Attribute(snap, procs.NewTable(box), []Kernel{kernelA, kernelB}))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"gpus":[{"index":0,"uuid":"GPU-s","name":"Simulated GPU","memory_total_bytes":100,"memory_used_bytes":30,"simulated":true,"level":"",` +
		`"notebook_bytes":10,"other_bytes":20,"free_bytes":70}],` +
		`"notebooks":[{"kernel_id":"aaaaaaaa-1111","notebook":"/home/alice/a.ipynb","display_name":"","pids":[100],"user":"alice","gpu_memory_bytes":10,"per_gpu":[{"index":0,"bytes":10}],"processes":[{"pid":100,"per_gpu":[{"index":0,"bytes":10}]}]},` +
		`{"kernel_id":"bbbbbbbb-2222","notebook":"/home/alice/b.ipynb","display_name":"","pids":[200],"user":"alice","gpu_memory_bytes":0,"per_gpu":[],"processes":[]}],` +
		`"other":[{"pid":300,"user":"bob","command":"python3 train.py --epochs 10","per_gpu":[{"index":0,"bytes":20}]}]}`
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	empty, _ := json.Marshal(Attribute(nvml.Snapshot{}, procs.NewTable(nil), nil))
	if want := `{"gpus":[],"notebooks":[],"other":[]}`; string(empty) != want {
		t.Errorf("empty report = %s, want %s", empty, want)
	}
}

func TestCommand(t *testing.T) {
	long := strings.Repeat("x", MaxCommandLen+50)
	accents := strings.Repeat("é", MaxCommandLen) // 2 bytes each
	tests := []struct {
		name string
		p    procs.Proc
		want string
	}{
		{"argv joined", procs.Proc{Argv: []string{"python3", "-m", "ipykernel_launcher"}}, "python3 -m ipykernel_launcher"},
		{"kernel thread or unreadable", procs.Proc{Comm: "kworker/0:1"}, "[kworker/0:1]"},
		{"nothing known", procs.Proc{}, ""},
		{"exactly the limit", procs.Proc{Argv: []string{long[:MaxCommandLen]}}, long[:MaxCommandLen]},
		{"long", procs.Proc{Argv: []string{long}}, long[:MaxCommandLen-len("…")] + "…"},
	}
	for _, tt := range tests {
		if got := command(tt.p); got != tt.want {
			t.Errorf("%s: command = %q, want %q", tt.name, got, tt.want)
		}
	}
	got := command(procs.Proc{Argv: []string{accents}})
	if len(got) > MaxCommandLen || !strings.HasSuffix(got, "…") || !utf8Valid(got) {
		t.Errorf("multi-byte cut: len %d, %q", len(got), got[len(got)-10:])
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestDetailPIDs(t *testing.T) {
	snap := nvml.Snapshot{Devices: []nvml.Device{
		device(0, 1, 0, gpuProc(5, 0), gpuProc(100, 0)),
		device(1, 1, 0, gpuProc(5, 0), gpuProc(6, 0)),
	}}
	got := DetailPIDs(snap, []Kernel{kernelA, {ID: "no pid"}})
	if want := []int{5, 6, 100}; !reflect.DeepEqual(got, want) {
		t.Errorf("DetailPIDs = %v, want %v", got, want)
	}
}
