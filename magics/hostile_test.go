package magics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/magics"
)

// hostileFree replaces the injected package's free with one that claims a
// driver figure and writes escape sequences, as a kernel's user can.
const hostileFree = `import sys
_m = sys.modules["_gpumem_magics"].magic
def _fake(req):
    return {"kind": "free", "schema": 1, "cache_only": True, "deleted": [], "hidden": [], "frameworks": [],
            "driver": {"before": 40 << 30, "after": 0}, "notes": ["\x1b]0;owned\x07note"],
            "text": "gpumem free\n\x1b[2J\x1b[Hdriver (NVML): 40.00 GiB -> 0 B for this kernel (-40.00 GiB)\rX",
            "html": ""}
_m.api_free = _fake
_m.api_render = _fake
`

// A kernel renders its own report, and its user may replace the code that
// does: its driver figure is dropped for the one the caller read, its
// text comes made safe and, rendered, marked as the kernel's.
func TestFreeCacheHostileKernel(t *testing.T) {
	s := newSession(t)
	s.inject(magics.InjectOptions{})
	s.cell(hostileFree, true)
	readings := []uint64{4 << 30, 4 << 30}
	calls := 0
	driver := func(context.Context) *uint64 { calls++; return &readings[min(calls, 2)-1] }
	fr, err := magics.FreeCache(context.Background(), s.ex, magics.FreeOptions{DriverBytes: driver})
	if err != nil {
		t.Fatal(err)
	}
	if fr.Driver == nil || fr.Driver.Before != 4<<30 || fr.Driver.After != 4<<30 {
		t.Errorf("driver %+v: want the caller's 4 GiB -> 4 GiB, not the kernel's claim", fr.Driver)
	}
	out := fr.Render()
	if strings.ContainsAny(out, "\x1b\x07\r") || strings.ContainsAny(strings.Join(fr.Notes, ""), "\x1b\x07") {
		t.Errorf("control characters reach the terminal:\n%q", out)
	}
	var driverLines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "driver") {
			driverLines = append(driverLines, line)
		}
	}
	if len(driverLines) != 1 || driverLines[0] != "driver (NVML, read by gpumem serve): 4.0 GiB -> 4.0 GiB for this kernel (0 B)" {
		t.Errorf("driver lines %q: want only gpumem's own\n%s", driverLines, out)
	}
	if !strings.Contains(out, `  kernel| \x1b[2J\x1b[Hdriver (NVML): 40.00 GiB`) {
		t.Errorf("the kernel's claim is not shown marked as the kernel's, escaped:\n%s", out)
	}

	// A refusal's text is the kernel's too.
	s.cell(`import sys
sys.modules["_gpumem_magics"].magic.api_free = lambda req: {"kind": "free", "error": "no \x1b[2Jvariable\nnamed x"}`, true)
	_, err = magics.FreeCache(context.Background(), s.ex, magics.FreeOptions{Vars: []string{"x"}})
	if !errors.Is(err, magics.ErrFreeRefused) || strings.ContainsAny(err.Error(), "\x1b\n") {
		t.Errorf("refusal: %q, want ErrFreeRefused without control characters", err)
	}
}

// The free --children report: the kernel's text marked as its own and
// escaped, then the daemon's processes and figures, their argv escaped; a
// kernel writing "ended pid" or "driver" lines into its text cannot pass
// them off as gpumem's (they stay behind "kernel| ").
func TestChildrenReportRender(t *testing.T) {
	rep := magics.ChildrenReport{
		Text:   "ended pid 1 (fake), 9 GiB: SIGTERM\ndriver (NVML, read by gpumem serve): 9 GiB -> 0 B\x1b[2J",
		Ended:  []magics.ChildOutcome{{PID: 4310, Command: "python3 -c spawn\x1b]0;t\x07", Bytes: 518 << 20, How: "SIGTERM"}},
		Left:   []magics.ChildOutcome{{PID: 4320, Command: "python3 helper.py", Bytes: 1 << 30, Reason: "owned by uid 1001, not ours"}},
		Before: 3 << 30, After: 2 << 30,
	}
	want := "the kernel's report, as the kernel wrote it:\n" +
		"  kernel| ended pid 1 (fake), 9 GiB: SIGTERM\n" +
		"  kernel| driver (NVML, read by gpumem serve): 9 GiB -> 0 B\\x1b[2J\n" +
		"ended pid 4310 (python3 -c spawn\\x1b]0;t\\x07), 518.0 MiB: SIGTERM\n" +
		"left pid 4320 (python3 helper.py), 1.0 GiB: owned by uid 1001, not ours\n" +
		"driver (NVML, read by gpumem serve): 3.0 GiB -> 2.0 GiB for this kernel (-1.0 GiB); the kernel itself was left running"
	if got := rep.Render(nil); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	none := magics.ChildrenReport{Text: "nothing", Before: 1 << 30, After: 1 << 30}
	if got := none.Render(nil); !strings.Contains(got, "gpumem serve: no worker process of this kernel held GPU memory\n") {
		t.Errorf("no processes:\n%s", got)
	}
}

// A worker left running for what it computes is named with its SM % and
// the command that ends it; one whose work is unknown, with what it
// holds; the kernel's name for it, and the daemon's notes, escaped. No
// kernel text: none is written (the kernel was busy).
func TestChildrenReportLeftRunning(t *testing.T) {
	sm := uint32(90)
	rep := magics.ChildrenReport{
		Left: []magics.ChildOutcome{
			{PID: 1234, Command: "/usr/bin/python3 -c work", Bytes: 1 << 30, Reason: "computing on a GPU (3 readings)", What: "DataLoader\x1b worker 0",
				GPUs: []int{0}, SMPercent: &sm, Compute: "computing", Confirm: true},
			{PID: 1235, Command: "python3", Bytes: 2 << 30, Reason: "its GPU utilization is unknown", GPUs: []int{0, 1}, Compute: "unknown", Confirm: true},
		},
		Notes:  []string{"the kernel runs a cell\x1b[2J"},
		Before: 3 << 30, After: 3 << 30,
	}
	got := rep.Render(func(pid int) string { return fmt.Sprintf("gpumem free k1 --children --pid %d", pid) })
	for _, want := range []string{
		"left running: pid 1234 python3 (DataLoader\\x1b worker 0) computes at 90% SM on GPU 0; to end it: gpumem free k1 --children --pid 1234\n",
		"left running: pid 1235 python3 holds 2.0 GiB on GPUs 0, 1 and whether it computes is unknown; to end it: gpumem free k1 --children --pid 1235\n",
		"the kernel runs a cell\\x1b[2J\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "kernel|") {
		t.Errorf("the report shows kernel text where the kernel wrote none:\n%s", got)
	}
}

func TestFreeReportRender(t *testing.T) {
	tests := []struct {
		name string
		in   magics.FreeReport
		want string
	}{
		{"with driver", magics.FreeReport{Text: "gpumem free\n\nnotes\n", Driver: &magics.DriverDelta{Before: 3 << 30, After: 1 << 30}},
			"the kernel's report, as the kernel wrote it:\n  kernel| gpumem free\n  kernel| \n  kernel| notes\n" +
				"driver (NVML, read by gpumem serve): 3.0 GiB -> 1.0 GiB for this kernel (-2.0 GiB)"},
		{"dry run", magics.FreeReport{Text: "x", DryRun: true},
			"the kernel's report, as the kernel wrote it:\n  kernel| x\ndriver (NVML): not read (a dry run frees nothing)"},
		{"standalone", magics.FreeReport{Text: "a\rb\x1b"},
			"the kernel's report, as the kernel wrote it:\n  kernel| a\\rb\\x1b\ndriver (NVML): not read (no gpumem serve follows this kernel)"},
	}
	for _, tt := range tests {
		if got := tt.in.Render(); got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.name, got, tt.want)
		}
	}
}
