package attribution

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// finishReport has two users' notebooks on GPU 0 (one of them also on
// GPU 1), a process of no kernel, and a GPU of 80 GiB at 50 GiB.
func finishReport() Report {
	return Report{
		GPUs: []GPU{{Index: 0, Name: "H200", MemoryTotalBytes: 80 << 30, MemoryUsedBytes: 70 << 30},
			{Index: 1, Name: "H200", MemoryTotalBytes: 80 << 30, MemoryUsedBytes: 9 << 30}},
		Notebooks: []Notebook{
			{KernelID: "a", ConnectionFile: "/a.json", Notebook: "/home/alice/secret.ipynb", User: "alice", GPUMemoryBytes: 3 << 30,
				PerGPU: []GPUBytes{{Index: 0, Bytes: 3 << 30}}},
			{KernelID: "b", ConnectionFile: "/b.json", Notebook: "/home/alice/b.ipynb", User: "alice", GPUMemoryBytes: 1 << 30,
				PerGPU: []GPUBytes{{Index: 0, Bytes: 1 << 30}}},
			{KernelID: "c", ConnectionFile: "/c.json", Notebook: "", User: "bob", GPUMemoryBytes: 9 << 30,
				PerGPU: []GPUBytes{{Index: 1, Bytes: 9 << 30}}},
			{KernelID: "d", ConnectionFile: "/d.json", Notebook: "/home/bob/idle.ipynb", User: "bob"},
		},
		Other: []OtherProcess{{PID: 7, User: "carol", Command: "serve --a-very-long-command-line-that-goes-on-and-on-and-on-past-sixty-runes",
			PerGPU: []GPUBytes{{Index: 0, Bytes: 2 << 30}}}},
	}
}

func TestFinishSteps(t *testing.T) {
	want := []string{"display_names", "pods", "compute", "peaks", "stray_contexts", "oom", "activity", "holders", "users", "levels", "alerts"}
	if got := FinishSteps(); !reflect.DeepEqual(got, want) {
		t.Errorf("FinishSteps = %v, want %v", got, want)
	}
}

// Holders rank notebooks and processes on each GPU, biggest first; the
// alert names the three biggest, or (shared mode) the users.
func TestFinishHolders(t *testing.T) {
	rep := finishReport()
	Finish(&rep, FinishInput{})
	var names []string
	for _, h := range rep.GPUs[0].Holders {
		names = append(names, h.Name)
	}
	if want := []string{"secret.ipynb", "pid 7 (carol)", "b.ipynb"}; !reflect.DeepEqual(names, want) {
		t.Errorf("GPU 0 holders %v, want %v", names, want)
	}
	if h := rep.GPUs[0].Holders[1]; h.Kind != HolderProcess || h.PID != 7 || len([]rune(h.Command)) != 60 {
		t.Errorf("process holder %+v", h)
	}
	if h := rep.GPUs[1].Holders; len(h) != 1 || h[0].Name != "kernel c" || h[0].Kind != HolderNotebook || h[0].ConnectionFile != "/c.json" {
		t.Errorf("GPU 1 holders %+v", h)
	}
	byUser := rep.GPUs[0].HoldersByUser
	if len(byUser) != 2 || byUser[0].Name != "user alice" || byUser[0].Bytes != 4<<30 || byUser[0].Notebooks != 2 ||
		byUser[1].Name != "user carol" || byUser[1].Processes != 1 {
		t.Errorf("GPU 0 by user %+v", byUser)
	}
	// A user of a shared daemon sees their own holders and the others by user.
	var own []string
	for _, h := range HoldersFor(rep.GPUs[0], "carol") {
		own = append(own, h.Name)
	}
	if want := []string{"user alice", "pid 7 (carol)"}; !reflect.DeepEqual(own, want) {
		t.Errorf("carol's view %v, want %v", own, want)
	}
	if len(rep.Users) != 3 || rep.Users[0].User != "bob" || rep.Users[0].Notebooks != 2 {
		t.Errorf("users %+v", rep.Users)
	}
}

func TestFinishAlerts(t *testing.T) {
	deadline := time.Date(2026, 1, 1, 14, 5, 0, 0, time.UTC)
	cull := CullWarning{KernelID: "b", ConnectionFile: "/b.json", User: "alice", Warning: 2, Deadline: deadline,
		Action: CullShutdown, Bytes: 12 << 30, Idle: 3 * time.Hour}
	for _, tc := range []struct {
		name string
		in   FinishInput
		want []Alert
	}{
		{"off", FinishInput{}, nil},
		{"under the threshold", FinishInput{Alerts: AlertConfig{Threshold: 0.9}}, nil},
		{"over, by notebook", FinishInput{Alerts: AlertConfig{Threshold: 0.8, Episodes: map[int]int{0: 3}}}, []Alert{{
			ID: "gpu0-3", Kind: AlertThreshold, GPU: 0, Kernels: []string{"a", "b"}, Bytes: 70 << 30,
			Message: "GPU 0 (H200) is 88% full: 70.0 GiB of 80.0 GiB used; biggest: secret.ipynb 3.0 GiB, " +
				"pid 7 (carol) 2.0 GiB, b.ipynb 1.0 GiB. `%gpumem free` returns this notebook's cached memory; " +
				"`%gpumem top` shows who holds the rest.",
			Headline: "GPU 0 is 88% full: 70.0 GiB of 80.0 GiB used; biggest: secret.ipynb 3.0 GiB, pid 7 (carol) 2.0 GiB"}}},
		{"over, by user, first crossing", FinishInput{Alerts: AlertConfig{Threshold: 0.8, NameUsers: true}}, []Alert{{
			ID: "gpu0-1", Kind: AlertThreshold, GPU: 0, Kernels: []string{"a", "b"}, Bytes: 70 << 30,
			Message: "GPU 0 (H200) is 88% full: 70.0 GiB of 80.0 GiB used; biggest: user alice 4.0 GiB, user carol 2.0 GiB. " +
				"`%gpumem free` returns this notebook's cached memory; `%gpumem top` shows who holds the rest.",
			Headline: "GPU 0 is 88% full: 70.0 GiB of 80.0 GiB used; biggest: user alice 4.0 GiB, user carol 2.0 GiB"}}},
		{"a cull warning", FinishInput{Culls: []CullWarning{cull}}, []Alert{{
			ID: "cull-b-2", Kind: AlertCull, GPU: -1, Kernels: []string{"b"}, User: "alice", Bytes: 12 << 30,
			Deadline: deadline, Action: CullShutdown,
			Message:  "this kernel holds 12.0 GiB and has been idle 3 h; it will be shut down at 14:05:00 unless used.",
			Headline: "b.ipynb holds 12.0 GiB, idle 3 h: it will be shut down at 14:05:00 unless used or kept."}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := finishReport()
			Finish(&rep, tc.in)
			if !reflect.DeepEqual(rep.Alerts, tc.want) {
				t.Errorf("alerts\n%+v\nwant\n%+v", rep.Alerts, tc.want)
			}
		})
	}
}

// Every cull action has its verb: the report action's sentence reads. A
// GPU-idle warning says that only GPU work cancels it, in the notebook and
// in the headline that names it.
func TestCullMessage(t *testing.T) {
	at := time.Date(2026, 1, 1, 14, 5, 0, 0, time.UTC)
	for action, want := range map[string]string{
		CullReport:   "it will be reported as an idle GPU holder at 14:05:00 unless used.",
		CullFree:     "it will have its GPU caches freed at 14:05:00 unless used.",
		CullShutdown: "it will be shut down at 14:05:00 unless used.",
		"":           "it will be culled at 14:05:00 unless used.",
	} {
		msg := CullMessage(CullWarning{Action: action, Bytes: 12 << 30, Idle: 3 * time.Hour, Deadline: at})
		if strings.HasPrefix(msg, "gpumem") {
			t.Errorf("CullMessage(%q) = %q: the notebook adds \"gpumem: \" itself, once", action, msg)
		}
		for _, w := range []string{"holds 12.0 GiB", "idle 3 h", want} {
			if !strings.Contains(msg, w) {
				t.Errorf("CullMessage(%q) = %q lacks %q", action, msg, w)
			}
		}
	}
	gpu := CullWarning{KernelID: "k", Action: CullShutdown, Bytes: 40 << 30, Idle: time.Hour, Deadline: at, GPUIdle: true}
	for got, want := range map[string]string{
		CullMessage(gpu): "this kernel holds 40.0 GiB and has done no GPU work for 1 h; it will be shut down at 14:05:00 " +
			"unless it computes on a GPU (running cells alone does not count).",
		cullHeadline("train.ipynb", gpu): "train.ipynb holds 40.0 GiB, no GPU work for 1 h: it will be shut down at 14:05:00 " +
			"unless it computes on a GPU or is kept.",
	} {
		if got != want {
			t.Errorf("GPU-idle warning:\n got %q\nwant %q", got, want)
		}
	}
}

func TestFinishLeftRunningAlert(t *testing.T) {
	rep := finishReport()
	Finish(&rep, FinishInput{Compute: &ComputeFacts{LeftRunning: []LeftRunning{{KernelID: "a", User: "alice", PID: 55,
		StartTime: 9, GPUs: []int{1}, Bytes: 5, Message: "pid 55 was left running"}}}})
	want := []Alert{{ID: "left-55-9", Kind: AlertLeftRunning, GPU: 1, Kernels: []string{"a"}, User: "alice", Bytes: 5,
		Message: "pid 55 was left running"}}
	if !reflect.DeepEqual(rep.Alerts, want) || rep.Alerts[0].InNotebook() {
		t.Errorf("alerts %+v", rep.Alerts)
	}
}

func TestFinishActivity(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	deadline := now.Add(time.Minute)
	for _, tc := range []struct {
		name string
		k    KernelActivity
		cull bool
		want *Activity
	}{
		{"idle since its last activity", KernelActivity{ExecutionState: "idle", LastActivity: now.Add(-time.Hour)}, false,
			&Activity{ExecutionState: "idle", LastActivity: now.Add(-time.Hour), IdleSeconds: 3600}},
		{"idle since it last computed", KernelActivity{ExecutionState: "idle", LastActivity: now.Add(-time.Hour), ComputedAt: now.Add(-time.Minute)}, false,
			&Activity{ExecutionState: "idle", LastActivity: now.Add(-time.Hour), IdleSeconds: 60}},
		{"busy by its server", KernelActivity{ExecutionState: "busy", LastActivity: now.Add(-time.Hour)}, false,
			&Activity{ExecutionState: "busy", LastActivity: now.Add(-time.Hour)}},
		{"busy by the daemon's view of its shell", KernelActivity{ExecutionState: "idle", LastActivity: now.Add(-time.Hour), ShellBusy: true}, false,
			&Activity{ExecutionState: "busy", LastActivity: now.Add(-time.Hour)}},
		{"warned", KernelActivity{ExecutionState: "idle", LastActivity: now.Add(-time.Hour)}, true,
			&Activity{ExecutionState: "idle", LastActivity: now.Add(-time.Hour), IdleSeconds: 3600, CullAt: deadline, CullAction: CullFree}},
		{"no activity known", KernelActivity{ExecutionState: "idle"}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := finishReport()
			in := FinishInput{Now: now, Kernels: map[string]KernelActivity{"/a.json": tc.k}}
			if tc.cull {
				in.Culls = []CullWarning{{KernelID: "a", ConnectionFile: "/a.json", Deadline: deadline, Action: CullFree}}
			}
			Finish(&rep, in)
			if got := rep.Notebooks[0].Activity; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("activity %+v, want %+v", got, tc.want)
			}
			if rep.Notebooks[1].Activity != nil {
				t.Errorf("a kernel no server reports has activity %+v", rep.Notebooks[1].Activity)
			}
		})
	}
}

func TestFinishOOM(t *testing.T) {
	rep := finishReport()
	gpu := 0
	Finish(&rep, FinishInput{OOM: map[string]OOMSummary{
		"/b.json": {Count: 2, LastEvent: 9, LastGPU: &gpu, LastRequestedBytes: 7, LastHeadline: "Out of memory in b.ipynb on GPU 0"},
		"/c.json": {Count: 1, LastEvent: 4}, // no headline (an older daemon's record): no alert
	}})
	if s := rep.Notebooks[1].OOM; s == nil || s.Count != 2 || rep.Notebooks[0].OOM != nil {
		t.Errorf("oom %+v %+v", rep.Notebooks[0].OOM, rep.Notebooks[1].OOM)
	}
	want := []Alert{{ID: "oom-b-9", Kind: AlertOOM, GPU: 0, Kernels: []string{"b"}, User: "alice", Bytes: 7,
		Message: "Out of memory in b.ipynb on GPU 0"}}
	if !reflect.DeepEqual(rep.Alerts, want) || rep.Alerts[0].InNotebook() {
		t.Errorf("alerts %+v", rep.Alerts)
	}
}

func TestOverThreshold(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		used, total uint64
		threshold   float64
		want        bool
	}{
		{80, 100, 0.8, true},
		{79, 100, 0.8, false},
		{100, 100, 0.8, true},
		{100, 100, 0, false},
		{100, 100, -1, false},
		{0, 0, 0.8, false},
		{85 * gib, 100 * gib, 0.8, true},
	} {
		g := GPU{MemoryUsedBytes: tc.used, MemoryTotalBytes: tc.total}
		if got := OverThreshold(g, tc.threshold); got != tc.want {
			t.Errorf("OverThreshold(used %d, total %d, %v) = %v, want %v", tc.used, tc.total, tc.threshold, got, tc.want)
		}
	}
}

// EveryoneElse: a Jupyter server's own kernels left out, the rest per
// user, with the users a shared daemon shows only as totals.
func TestEveryoneElse(t *testing.T) {
	dave := UserUsage{User: "dave", Notebooks: 2, OtherProcesses: 1, GPUMemoryBytes: 5 << 30, PerGPU: []GPUBytes{{Index: 0, Bytes: 5 << 30}}}
	got := EveryoneElse(finishReport(), map[string]bool{"a": true, "c": true}, []UserUsage{dave})
	var names []string
	for _, u := range got {
		names = append(names, u.User)
	}
	if want := []string{"dave", "carol", "alice", "bob"}; !reflect.DeepEqual(names, want) {
		t.Errorf("users %v, want %v", names, want)
	}
	if got[2].Notebooks != 1 || got[2].NotebookBytes != 1<<30 || got[3].Notebooks != 1 || got[3].GPUMemoryBytes != 0 ||
		got[1].OtherProcesses != 1 || got[1].OtherBytes != 2<<30 {
		t.Errorf("carol %+v, alice %+v, bob %+v", got[1], got[2], got[3])
	}
}

// A job left running after its kernel's restart stays the kernel's: a
// server's own kernel's job is not everyone else's; another kernel's is.
func TestEveryoneElseLeftRunning(t *testing.T) {
	r := finishReport()
	r.LeftRunning = []LeftRunning{{KernelID: "a", PID: 7, User: "carol", Bytes: 2 << 30}}
	if got := EveryoneElse(r, map[string]bool{"a": true, "c": true}, nil); slices.ContainsFunc(got, func(u UserUsage) bool { return u.User == "carol" }) {
		t.Errorf("kernel a's job left running (pid 7) is counted as everyone else's: %+v", got)
	}
	got := EveryoneElse(r, map[string]bool{"c": true}, nil)
	if i := slices.IndexFunc(got, func(u UserUsage) bool { return u.User == "carol" }); i < 0 || got[i].OtherProcesses != 1 {
		t.Errorf("another server's kernel's job left running is everyone else's: %+v", got)
	}
}
