package oom

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

const gib = 1 << 30

func intp(i int) *int       { return &i }
func strp(s string) *string { return &s }

// cf is the fixture's connection file of a kernel id.
func cf(id string) string { return "/rt/kernel-" + id + ".json" }

// fixtureAt is when the fixture's reports are finished.
var fixtureAt = time.Unix(100_000, 0)

// fixture is the joined report (before Finish): an 80 GiB GPU 0 where
// train.ipynb (user a, kernel k-self) holds 10 GiB, a's idle hold.ipynb
// 40 GiB, b's idle notebook 25 GiB and a process of b 4 GiB; GPU 1 is
// empty. finish completes it as the daemon does.
func fixture() attribution.Report {
	per := func(idx int, b uint64) []attribution.GPUBytes { return []attribution.GPUBytes{{Index: idx, Bytes: b}} }
	return attribution.Report{
		GPUs: []attribution.GPU{
			{Index: 0, UUID: "GPU-aaaa-0000", Name: "H200", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 79 * gib, FreeBytes: 1 * gib},
			{Index: 1, UUID: "GPU-bbbb-1111", Name: "H200", MemoryTotalBytes: 80 * gib, FreeBytes: 80 * gib},
		},
		Notebooks: []attribution.Notebook{
			{KernelID: "k-self-0001", ConnectionFile: cf("k-self-0001"), Notebook: "/home/a/train.ipynb", User: "a", PIDs: []int{10}, GPUMemoryBytes: 10 * gib,
				PerGPU: per(0, 10*gib), Processes: []attribution.ProcessBytes{{PID: 10, PerGPU: per(0, 10*gib)}}},
			{KernelID: "k-hold-0002", ConnectionFile: cf("k-hold-0002"), Notebook: "/home/a/hold.ipynb", User: "a", PIDs: []int{20, 21}, GPUMemoryBytes: 40 * gib,
				PerGPU: per(0, 40*gib), Processes: []attribution.ProcessBytes{{PID: 20, PerGPU: per(0, 30*gib)}, {PID: 21, PerGPU: per(0, 10*gib)}}},
			{KernelID: "k-bbbb-0003", ConnectionFile: cf("k-bbbb-0003"), Notebook: "/home/b/secret.ipynb", User: "b", PIDs: []int{30}, GPUMemoryBytes: 25 * gib,
				PerGPU: per(0, 25*gib), Processes: []attribution.ProcessBytes{{PID: 30, PerGPU: per(0, 25*gib)}}},
			{KernelID: "k-none-0004", ConnectionFile: cf("k-none-0004"), Notebook: "/home/a/empty.ipynb", User: "a", PIDs: []int{40}},
		},
		Other: []attribution.OtherProcess{{PID: 50, User: "b", Command: "/usr/bin/python3 serve.py --port 1", PerGPU: per(0, 4*gib)}},
	}
}

// finish finishes rep as the daemon does before it publishes it, with
// what the fixture's servers say: train.ipynb busy, hold.ipynb idle for
// 3 min, b's notebook for 3 h.
func finish(rep *attribution.Report) {
	since := func(d time.Duration) time.Time { return fixtureAt.Add(-d) }
	attribution.Finish(rep, attribution.FinishInput{Now: fixtureAt, Kernels: map[string]attribution.KernelActivity{
		cf("k-self-0001"): {ExecutionState: "busy", LastActivity: since(time.Second)},
		cf("k-hold-0002"): {ExecutionState: "idle", LastActivity: since(3 * time.Minute)},
		cf("k-bbbb-0003"): {ExecutionState: "idle", LastActivity: since(3 * time.Hour)},
	}})
}

// finished is the fixture, finished.
func finished() attribution.Report {
	rep := fixture()
	finish(&rep)
	return rep
}

func TestAssessHoldersAndGPU(t *testing.T) {
	now := time.Unix(1000, 0)
	rep := finished()
	ev := Assess(rep, "k-self-0001", cf("k-self-0001"), Request{Framework: "torch", RequestedBytes: 8 * gib, Device: Device{Ordinal: intp(0)}}, now, now)
	if ev.GPU == nil || ev.GPU.Index != 0 || ev.GPU.FreeBytes != 1*gib {
		t.Fatalf("gpu %+v", ev.GPU)
	}
	if ev.Notebook != "/home/a/train.ipynb" || ev.User != "a" || ev.Name != "train.ipynb" {
		t.Errorf("kernel: %q %q %q", ev.Notebook, ev.User, ev.Name)
	}
	// The report's ranking, row for row: the event ranks nothing itself.
	if len(ev.Holders) != len(rep.GPUs[0].Holders) {
		t.Fatalf("%d rows of %d holders", len(ev.Holders), len(rep.GPUs[0].Holders))
	}
	for i, h := range rep.GPUs[0].Holders {
		if r := ev.Holders[i]; r.Self {
			h.Name = "this kernel"
			if r.Holder != h {
				t.Errorf("row %d: %+v, want the report's %+v named this kernel", i, r.Holder, h)
			}
		} else if r.Holder != h {
			t.Errorf("row %d: %+v, want the report's %+v", i, r.Holder, h)
		}
	}
	var got []string
	for _, h := range ev.Holders {
		got = append(got, h.Kind+":"+h.User+":"+bytesText(h.Bytes)+":"+h.Name+":"+fmt.Sprint(h.PIDs))
	}
	want := []string{"notebook:a:40.0 GiB:hold.ipynb:[20 21]", "notebook:b:25.0 GiB:secret.ipynb:[30]",
		"notebook:a:10.0 GiB:this kernel:[10]", "process:b:4.0 GiB:pid 50 (b):[50]"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("holders:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !ev.Holders[2].Self || ev.Holders[0].Self {
		t.Errorf("self flags: %+v", ev.Holders)
	}
	if ev.Holders[0].IdleSeconds != 180 || ev.Holders[0].State != "idle" || ev.Holders[2].IdleSeconds != 0 || ev.Holders[2].State != "busy" {
		t.Errorf("activity: %+v %+v", ev.Holders[0], ev.Holders[2])
	}
	if !slices.Equal(ev.HoldersByUser, rep.GPUs[0].HoldersByUser) {
		t.Errorf("by user: %+v, want the report's %+v", ev.HoldersByUser, rep.GPUs[0].HoldersByUser)
	}
}

// The cached figure every face shows is the event's: reserved less
// allocated, never below zero, whatever the kernel sent for it.
func TestAssessCached(t *testing.T) {
	for _, c := range []struct {
		name                string
		allocated, reserved uint64
		sent, want          uint64
	}{
		{"cache", 1 * gib, 10 * gib, 0, 9 * gib},
		{"the kernel's own figure is not read", 1 * gib, 10 * gib, 1, 9 * gib},
		{"reserved below allocated", 3 * gib, 2 * gib, 5, 0},
	} {
		req := Request{Framework: "torch", Kernel: Kernel{AllocatedBytes: c.allocated, ReservedBytes: c.reserved, CachedBytes: c.sent}}
		if got := Assess(finished(), "k-self-0001", cf("k-self-0001"), req, fixtureAt, fixtureAt).Kernel.CachedBytes; got != c.want {
			t.Errorf("%s: cached %d, want %d", c.name, got, c.want)
		}
	}
}

func TestResolveGPU(t *testing.T) {
	rep := fixture()
	self := &rep.Notebooks[0]
	cases := []struct {
		name string
		d    Device
		self *attribution.Notebook
		want int // -1: none
	}{
		{"uuid wins over ordinal", Device{UUID: "bbbb-1111", Ordinal: intp(0)}, self, 1},
		{"uuid with prefix", Device{UUID: "GPU-BBBB"}, nil, 1},
		{"ordinal without CUDA_VISIBLE_DEVICES", Device{Ordinal: intp(1)}, nil, 1},
		{"CUDA_VISIBLE_DEVICES renumbers", Device{Ordinal: intp(0), VisibleDevices: strp("1,0")}, nil, 1},
		{"CUDA_VISIBLE_DEVICES by uuid", Device{Ordinal: intp(0), VisibleDevices: strp("GPU-aaaa")}, nil, 0},
		{"ordinal past CUDA_VISIBLE_DEVICES: where the kernel holds most", Device{Ordinal: intp(3), VisibleDevices: strp("1")}, self, 0},
		{"nothing said: where the kernel holds most", Device{}, self, 0},
		{"nothing known", Device{}, nil, -1},
		{"unknown index", Device{Ordinal: intp(7)}, nil, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := resolveGPU(rep, c.self, c.d)
			got := -1
			if g != nil {
				got = g.Index
			}
			if got != c.want {
				t.Errorf("got GPU %d, want %d", got, c.want)
			}
		})
	}
	one := attribution.Report{GPUs: rep.GPUs[:1]}
	if g := resolveGPU(one, nil, Device{}); g == nil || g.Index != 0 {
		t.Errorf("the only GPU: %v", g)
	}
}

func TestAdviceAndHeadline(t *testing.T) {
	base := func() Request { return Request{Framework: "torch", Device: Device{Ordinal: intp(0)}} }
	cases := []struct {
		name     string
		kernel   string
		req      func(r *Request)
		report   func(r *attribution.Report)
		advice   string
		headline string
	}{
		{
			name: "IPython holds enough: free --all, keeping the variables",
			req: func(r *Request) {
				r.RequestedBytes = 4 * gib
				r.Kernel = Kernel{IPythonBytes: 12 * gib, IPythonRefs: []string{"Out[7]", "OutOfMemoryError traceback: forward() locals"},
					Variables: []Holding{{"model", 6 * gib}, {"opt", 2 * gib}}}
			},
			advice:   "`%gpumem free --all --keep model,opt` returns 12.0 GiB held by Out[7] and this traceback (your variables stay)",
			headline: "Out of memory in train.ipynb on GPU 0: 40.0 GiB held by your idle notebook hold.ipynb",
		},
		{
			name: "IPython holds enough and no variable",
			req: func(r *Request) {
				r.RequestedBytes = 4 * gib
				r.Kernel = Kernel{IPythonBytes: 12 * gib, IPythonRefs: []string{"Out[7]", "_7"}}
			},
			advice: "`%gpumem free --all` returns 12.0 GiB held by Out[7] and _7",
		},
		{
			name: "too many variables to list",
			req: func(r *Request) {
				r.RequestedBytes = 4 * gib
				r.Kernel = Kernel{IPythonBytes: 5 * gib, IPythonRefs: []string{"RuntimeError traceback: f() locals"},
					Variables: []Holding{{"a", 1}}, VariablesTruncated: true}
			},
			advice: "5.0 GiB is held by this traceback only: `%gpumem free --all --dry-run` shows what --all would delete (your variables too; --keep NAME spares one)",
		},
		{
			name: "fragmented",
			req: func(r *Request) {
				r.RequestedBytes = 4 * gib
				r.Kernel = Kernel{AllocatedBytes: 1 * gib, ReservedBytes: 10 * gib, FragmentedBytes: 9 * gib}
			},
			advice: "fragmented: 9.0 GiB free in PyTorch's cache but no block of 4.0 GiB: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA use (restart the kernel)",
		},
		{
			name: "fragmented but expandable already: the holders",
			req: func(r *Request) {
				r.RequestedBytes = 4 * gib
				r.Kernel = Kernel{AllocatedBytes: 1 * gib, ReservedBytes: 10 * gib, ExpandableSegments: true}
			},
			advice: "hold.ipynb (yours, idle 3 min) holds 40.0 GiB of GPU 0: `gpumem free hold.ipynb --all` frees it, or shut its kernel down",
		},
		{
			name:     "another user's idle notebook, never by path",
			req:      func(r *Request) { r.RequestedBytes = 20 * gib },
			report:   func(r *attribution.Report) { r.Notebooks[1].PerGPU[0].Bytes = 1 * gib; r.Notebooks[1].Processes = nil },
			advice:   "user b's notebook, idle 3 h, holds 25.0 GiB of GPU 0: ask b, or an admin (`gpumem free` as root)",
			headline: "Out of memory in train.ipynb on GPU 0: 25.0 GiB held by user b's idle notebook",
		},
		{
			name:     "a process of another user",
			req:      func(r *Request) { r.RequestedBytes = 4 * gib },
			report:   func(r *attribution.Report) { r.Notebooks = r.Notebooks[:1] },
			advice:   "a process of user b holds 4.0 GiB of GPU 0: ask b",
			headline: "Out of memory in train.ipynb on GPU 0: 4.0 GiB held by a process of user b",
		},
		{
			name: "an own process",
			req:  func(r *Request) { r.RequestedBytes = 4 * gib },
			report: func(r *attribution.Report) {
				r.Notebooks = r.Notebooks[:1]
				r.Other[0].User = "a"
			},
			advice:   "your process 50 (python3 serve.py) holds 4.0 GiB of GPU 0: end it if it is done",
			headline: "Out of memory in train.ipynb on GPU 0: 4.0 GiB held by your process 50 (python3 serve.py)",
		},
		{
			name: "a notebook name two notebooks share: the kernel id",
			req:  func(r *Request) { r.RequestedBytes = 30 * gib },
			report: func(r *attribution.Report) {
				r.Notebooks[3].Notebook = "/home/a/old/hold.ipynb"
			},
			advice: "hold.ipynb (yours, idle 3 min) holds 40.0 GiB of GPU 0: `gpumem free k-hold-0 --all` frees it, or shut its kernel down",
		},
		{
			name:   "nobody frees enough; this kernel holds the most",
			req:    func(r *Request) { r.RequestedBytes = 70 * gib },
			report: func(r *attribution.Report) { r.Notebooks[0].PerGPU[0].Bytes = 50 * gib },
			advice: "this kernel holds 50.0 GiB of GPU 0 and asked for 70.0 GiB more: `%gpumem vars` shows what holds it; free what is no longer needed or use smaller batches",
		},
		{
			name: "TensorFlow holding the GPU itself",
			req: func(r *Request) {
				r.Framework = "tensorflow"
				r.RequestedBytes = 70 * gib
			},
			report: func(r *attribution.Report) { r.Notebooks[0].PerGPU[0].Bytes = 50 * gib },
			advice: "this kernel holds 50.0 GiB of GPU 0 and TensorFlow returns memory only when the process exits: restart the kernel, then set tf.config.experimental.set_memory_growth before using the GPU",
		},
		{
			name:   "nobody frees enough; another holds the most",
			req:    func(r *Request) { r.RequestedBytes = 70 * gib },
			advice: "no single holder frees enough; the biggest: hold.ipynb (yours, idle 3 min) holds 40.0 GiB of GPU 0: `gpumem free hold.ipynb --all` frees it, or shut its kernel down",
		},
		{
			name:     "an empty GPU too small",
			req:      func(r *Request) { r.RequestedBytes = 90 * gib; r.Device.Ordinal = intp(1) },
			advice:   "GPU 1 has 80.0 GiB free and 90.0 GiB was asked: it does not fit on this GPU; use smaller batches or another GPU",
			headline: "Out of memory in train.ipynb on GPU 1",
		},
		{
			name:     "unknown GPU",
			kernel:   "k-none-0004",
			req:      func(r *Request) { r.RequestedBytes = 1 * gib; r.Device = Device{} },
			advice:   "gpumem serve could not tell which GPU this was: `gpumem ls` shows who holds each GPU",
			headline: "Out of memory in empty.ipynb: 1.0 GiB asked",
		},
		{
			name:     "a kernel the daemon does not know",
			kernel:   "k-gone",
			req:      func(r *Request) { r.RequestedBytes = 1 * gib; r.Device = Device{} },
			headline: "Out of memory in kernel k-gone: 1.0 GiB asked",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := fixture()
			if c.report != nil {
				c.report(&rep)
			}
			finish(&rep)
			req := base()
			c.req(&req)
			k := c.kernel
			if k == "" {
				k = "k-self-0001"
			}
			ev := Assess(rep, k, cf(k), req, time.Unix(1, 0), time.Unix(2, 0))
			if c.advice != "" && ev.Advice != c.advice {
				t.Errorf("advice:\n got %s\nwant %s", ev.Advice, c.advice)
			}
			if c.headline != "" && ev.Headline != c.headline {
				t.Errorf("headline:\n got %s\nwant %s", ev.Headline, c.headline)
			}
			// Never another user's path, whatever the case.
			for _, s := range []string{ev.Advice, ev.Headline} {
				if strings.Contains(s, "secret") || strings.Contains(s, "k-bbbb") || strings.Contains(s, "serve.py") && !strings.Contains(c.name, "own process") {
					t.Errorf("names another user's notebook or process: %s", s)
				}
			}
		})
	}
}

// A kernel is its connection file: another user's kernel of the same id
// (a file named after it) is neither the event's kernel nor its Self row.
func TestAssessByConnectionFile(t *testing.T) {
	rep := fixture()
	twin := rep.Notebooks[2] // b's, 25 GiB on GPU 0
	twin.KernelID = "k-self-0001"
	rep.Notebooks[2] = twin
	finish(&rep)
	ev := Assess(rep, "k-self-0001", cf("k-self-0001"), Request{Framework: "torch", RequestedBytes: 8 * gib, Device: Device{Ordinal: intp(0)}},
		time.Unix(1, 0), time.Unix(2, 0))
	if ev.User != "a" || ev.Notebook != "/home/a/train.ipynb" || ev.ConnectionFile != cf("k-self-0001") {
		t.Errorf("event of %q %q %q, want a's train.ipynb", ev.User, ev.Notebook, ev.ConnectionFile)
	}
	for _, h := range ev.Holders {
		if h.Self != (h.ConnectionFile == cf("k-self-0001")) || h.Self != (h.Name == "this kernel") {
			t.Errorf("self flag on %+v", h)
		}
	}
	if v := ev.For("a"); strings.Contains(fmt.Sprint(v.Holders), "secret") {
		t.Errorf("a's view shows b's twin: %+v", v.Holders)
	}
}

// A user's view of an event shows other users as the report's own view
// shows them (attribution.HoldersFor): one holder each, their total, and
// never a notebook, kernel id, connection file, pid or command of theirs.
func TestForHidesOtherUsers(t *testing.T) {
	rep := finished()
	ev := Assess(rep, "k-self-0001", cf("k-self-0001"), Request{Framework: "torch", RequestedBytes: 8 * gib, Device: Device{Ordinal: intp(0)}},
		time.Unix(1, 0), time.Unix(2, 0))
	view := ev.For("a")
	b, _ := json.Marshal(view)
	for _, leak := range []string{"secret.ipynb", "k-bbbb", "serve.py", "pid 50", `[30]`, `[50]`, `"pid":`} {
		if strings.Contains(string(b), leak) {
			t.Errorf("a's view shows %q: %s", leak, b)
		}
	}
	var rows []string
	for _, h := range view.Holders {
		rows = append(rows, h.Kind+":"+h.Name+":"+bytesText(h.Bytes)+":"+fmt.Sprint(h.PIDs, h.Notebooks, h.Processes))
	}
	// b's notebook and process are one holder, 29 GiB, ranked with a's own.
	want := []string{"notebook:hold.ipynb:40.0 GiB:[20 21] 0 0", "user:user b:29.0 GiB:[] 1 1", "notebook:this kernel:10.0 GiB:[10] 0 0"}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("a's view:\n%s\nwant\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	if view.View != "own" || !view.Holders[2].Self || view.Advice != ev.Advice || view.Name != "train.ipynb" {
		t.Errorf("a's own event: %+v", view)
	}
	// The report's own view of that GPU holds the same holders.
	own := attribution.HoldersFor(rep.GPUs[0], "a")
	for i := range own {
		if own[i].Name != view.Holders[i].Name && !view.Holders[i].Self || own[i].Bytes != view.Holders[i].Bytes {
			t.Errorf("row %d: %+v, the own view's %+v", i, view.Holders[i].Holder, own[i])
		}
	}
	// The stored event is untouched.
	if ev.Holders[1].Name != "secret.ipynb" || ev.View != "" || len(ev.Holders) != 4 {
		t.Errorf("For changed the event: %+v", ev.Holders)
	}
	// Anyone but the event's user sees none of a's notebooks, cell or text:
	// a is one holder too.
	ev.Cell, ev.Message = Cell{Source: "secret_line = 1"}, "a's message"
	bv := ev.For("b")
	vb, _ := json.Marshal(bv)
	for _, leak := range []string{"hold.ipynb", "k-hold", "train.ipynb", "k-self", "this kernel", "secret_line", "a's message", "[20", "[10]"} {
		if strings.Contains(string(vb), leak) {
			t.Errorf("b's view of a's event shows %q: %s", leak, vb)
		}
	}
	if len(bv.Holders) != 3 || bv.Holders[0].Name != "user a" || bv.Holders[0].Bytes != 50*gib || bv.Holders[0].Notebooks != 2 {
		t.Errorf("b's view of a's event: %+v", bv.Holders)
	}
}

func TestRequestClean(t *testing.T) {
	long := strings.Repeat("é", 1000)
	r := Request{Framework: "cupy", Error: "cupy.cuda.memory.OutOfMemoryError\x1b[31m", Message: "line1\nline2\u202e" + long,
		Cell: Cell{Source: "x = 1\x00" + long}, Kernel: Kernel{IPythonRefs: make([]string, 40), Variables: make([]Holding, 50)}}
	if err := r.Clean(); err != nil {
		t.Fatal(err)
	}
	// Control and bidirectional characters are shown escaped (textsafe),
	// newlines as spaces; bounds are bytes, cut on a rune boundary.
	if r.Error != `cupy.cuda.memory.OutOfMemoryError\x1b[31m` {
		t.Errorf("error %q", r.Error)
	}
	if !strings.HasPrefix(r.Message, `line1 line2\u202eé`) || len(r.Message) > maxMessage || len(r.Message) < maxMessage-4 ||
		!strings.HasSuffix(r.Message, "…") || !utf8.ValidString(r.Message) {
		t.Errorf("message %q (%d bytes)", r.Message[:20], len(r.Message))
	}
	if len(r.Cell.Source) > maxSource || !strings.HasPrefix(r.Cell.Source, `x = 1\x00é`) || strings.ContainsRune(r.Cell.Source, 0) {
		t.Errorf("source %q (%d bytes)", r.Cell.Source[:12], len(r.Cell.Source))
	}
	if len(r.Kernel.IPythonRefs) != maxRefs || len(r.Kernel.Variables) != maxVariables || !r.Kernel.VariablesTruncated {
		t.Errorf("caps: %d refs %d vars", len(r.Kernel.IPythonRefs), len(r.Kernel.Variables))
	}
	for _, bad := range []Request{{Framework: "numpy"}, {Framework: "torch", Device: Device{Ordinal: intp(-1)}},
		{Framework: "torch", Cell: Cell{Line: -3}}} {
		if err := bad.Clean(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

var update = flag.Bool("update", false, "rewrite testdata/report/golden-oom-own.json")

// TestGoldenOwnView pins alice's view of the golden out-of-memory event
// (golden-oom.json, which sidecar/attribution's golden test assesses from
// the golden report) to golden-oom-own.json, which the TypeScript and
// Python tests read as what a user of a shared daemon is sent. -update
// rewrites it.
func TestGoldenOwnView(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "report")
	data, err := os.ReadFile(filepath.Join(dir, "golden-oom.json"))
	if err != nil {
		t.Fatalf("%v (go test ./sidecar/attribution -run Golden -update writes it)", err)
	}
	var ev Event
	if err := json.Unmarshal(data, &ev); err != nil {
		t.Fatal(err)
	}
	view := ev.For(ev.User)
	for _, h := range view.Holders {
		if h.User != ev.User && (h.Kind != attribution.HolderUser || h.KernelID != "" || h.ConnectionFile != "" || len(h.PIDs) > 0) {
			t.Errorf("%s's view shows another user's holder: %+v", ev.User, h)
		}
	}
	got, err := json.MarshalIndent(view, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join(dir, "golden-oom-own.json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./sidecar/oom -run Golden -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what Go writes now: go test ./sidecar/oom -run Golden -update rewrites it, then the "+
			"TypeScript and Python tests say what their readers make of it.\n--- got ---\n%s", path, got)
	}
}
