package daemon

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// free --children's decision, for each kind of work (computing, unknown,
// idle) × confirmed by pid or not × in the kernel's tree or not (another
// kernel's, another user's, or no recorded process at all): only an idle
// worker of the tree is ended unasked; a confirmed one of the tree is
// ended whatever it computes; confirmation never reaches beyond the tree.
func TestPlanChildren(t *testing.T) {
	cfg := ComputeConfig{}
	cfg.defaults()
	window := func(pattern string) judgement { return cfg.judge(readings(t0, pattern), t0, t0.Add(time.Minute)) }
	work := map[string]judgement{
		"computing": window("aaaaaaaaaa"),
		"unknown":   window("??????????"),
		"idle":      window(".........."),
	}
	const pid = 4242
	trees := map[string]decision{
		"in tree":        {candidate: candidate{ID: procID{pid, 7}, UID: 1000, Argv: "python -c w", Bytes: 1 << 30}, Kill: true},
		"another kernel": {candidate: candidate{ID: procID{pid, 7}, UID: 1000}, Reason: "belongs to a live kernel"},
		"another user":   {candidate: candidate{ID: procID{pid, 7}, UID: 1001}, Reason: "owned by uid 1001, not ours"},
		"not recorded":   {}, // the pid names no process of the recorded tree
	}
	for _, kind := range []string{"computing", "unknown", "idle"} {
		for _, confirmed := range []bool{false, true} {
			for tree, dec := range trees {
				name := fmt.Sprintf("%s/confirmed=%v/%s", kind, confirmed, tree)
				t.Run(name, func(t *testing.T) {
					var decs []decision
					if dec.ID.PID != 0 {
						decs = []decision{dec}
					}
					var pids []int
					if confirmed {
						pids = []int{pid}
					}
					plans, notFound := planChildren(decs, func(procID) judgement { return work[kind] }, cfg, pids)
					wantKill := tree == "in tree" && (confirmed || kind == "idle")
					if tree == "not recorded" {
						if len(plans) != 0 {
							t.Fatalf("plans %+v for a pid of no recorded process", plans)
						}
						if confirmed != slices.Equal(notFound, []int{pid}) {
							t.Errorf("notFound = %v, want the confirmed pid %d said to be none of the kernel's", notFound, pid)
						}
						return
					}
					if len(plans) != 1 || len(notFound) != 0 {
						t.Fatalf("plans %+v, notFound %v: want one plan", plans, notFound)
					}
					p := plans[0]
					if p.Kill != wantKill {
						t.Fatalf("Kill = %v (%q), want %v", p.Kill, p.Reason, wantKill)
					}
					wantConfirm := tree == "in tree" && !confirmed && kind != "idle"
					if p.confirm != wantConfirm {
						t.Errorf("confirm = %v, want %v (left running for its work, to be confirmed)", p.confirm, wantConfirm)
					}
					switch {
					case p.Kill && p.Reason != "":
						t.Errorf("ended with a reason to leave it: %q", p.Reason)
					case !p.Kill && tree != "in tree" && p.Reason != dec.Reason:
						t.Errorf("reason %q, want reclaim's %q to stand", p.Reason, dec.Reason)
					case !p.Kill && tree == "in tree" && !strings.Contains(p.Reason, map[string]string{
						"computing": "computing on a GPU", "unknown": "its GPU utilization is unknown"}[kind]):
						t.Errorf("reason %q does not say what it computes", p.Reason)
					}
				})
			}
		}
	}
}

// With pids confirmed, only those are ended: an idle worker of the tree
// that was not named is left alone too, and said to be.
func TestPlanChildrenConfirmedOnly(t *testing.T) {
	cfg := ComputeConfig{}
	cfg.defaults()
	idle := cfg.judge(readings(t0, ".........."), t0, t0.Add(time.Minute))
	busy := cfg.judge(readings(t0, "aaaaaaaaaa"), t0, t0.Add(time.Minute))
	decs := []decision{
		{candidate: candidate{ID: procID{20, 1}}, Kill: true},
		{candidate: candidate{ID: procID{10, 1}}, Kill: true},
	}
	judge := func(id procID) judgement {
		if id.PID == 10 {
			return busy
		}
		return idle
	}
	plans, notFound := planChildren(decs, judge, cfg, []int{10, 99})
	if len(plans) != 2 || plans[0].ID.PID != 10 || plans[1].ID.PID != 20 {
		t.Fatalf("plans %+v, want pids 10 and 20 in order", plans)
	}
	if !plans[0].Kill || plans[1].Kill || !strings.Contains(plans[1].Reason, "not among the pids confirmed (10,99)") {
		t.Errorf("plans %+v: want the confirmed computing 10 ended, the idle 20 left alone", plans)
	}
	if !slices.Equal(notFound, []int{99}) {
		t.Errorf("notFound = %v, want [99]", notFound)
	}
	if settlingLeft(plans) {
		t.Error("settling with every verdict in")
	}
	// Unconfirmed, one without readings yet is waited for.
	plans, _ = planChildren(decs[:1], func(procID) judgement { return cfg.judge(nil, t0, t0.Add(time.Minute)) }, cfg, nil)
	if plans[0].Kill || !settlingLeft(plans) {
		t.Errorf("a worker without readings: %+v, want left and waited for", plans)
	}
}

// --reclaim-unknown=end, reclaim's own switch, ends an unknown worker
// unasked; a computing one still waits for its pid.
func TestPlanChildrenReclaimUnknownEnd(t *testing.T) {
	cfg := ComputeConfig{ReclaimUnknown: ReclaimEnd}
	cfg.defaults()
	dec := []decision{{candidate: candidate{ID: procID{5, 1}}, Kill: true}}
	for pattern, want := range map[string]bool{"??????????": true, "aaaaaaaaaa": false} {
		j := cfg.judge(readings(t0, pattern), t0, t0.Add(time.Minute))
		plans, _ := planChildren(dec, func(procID) judgement { return j }, cfg, nil)
		if plans[0].Kill != want {
			t.Errorf("%s: Kill = %v, want %v", pattern, plans[0].Kill, want)
		}
	}
}

// The teardown ends every worker it knows: it runs only when nothing is
// confirmed, the kernel is idle and no worker is left for its work.
func TestChildrenTeardownSkipped(t *testing.T) {
	left := []childPlan{{decision: decision{candidate: candidate{ID: procID{7, 1}}}, confirm: true}}
	for _, tc := range []struct {
		busy      bool
		confirmed []int
		plans     []childPlan
		want      string
	}{
		{false, nil, nil, ""},
		{false, []int{7}, nil, "only the pids confirmed"},
		{true, nil, nil, "running a cell"},
		{false, nil, left, "pid 7 is left running"},
	} {
		got := childrenTeardownSkipped(tc.busy, tc.confirmed, tc.plans)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("busy=%v confirmed=%v plans=%d: %q, want %q", tc.busy, tc.confirmed, len(tc.plans), got, tc.want)
		}
	}
}
