package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

func TestCullDecide(t *testing.T) {
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	cfg := CullConfig{Idle: time.Hour, MinMemory: 1 << 30, Action: CullShutdown, Warn: 10 * time.Minute, ExemptUsers: []string{"carol"}}
	idle2h := now.Add(-2 * time.Hour)
	warned := cullState{warnedAt: now.Add(-5 * time.Minute), deadline: now.Add(5 * time.Minute), activityAtWarn: idle2h}
	expired := cullState{warnedAt: now.Add(-11 * time.Minute), deadline: now.Add(-time.Minute), activityAtWarn: idle2h}
	base := cullInput{now: now, hasServer: true, execState: "idle", lastActivity: idle2h, bytes: 4 << 30, user: "alice"}
	with := func(f func(*cullInput)) cullInput { in := base; f(&in); return in }
	tests := []struct {
		name string
		in   cullInput
		want cullVerdict
	}{
		{"idle, holding memory: warned first", base, cullWarnNow},
		{"within the warning", with(func(in *cullInput) { in.state = warned }), cullNothing},
		{"warning over: act", with(func(in *cullInput) { in.state = expired }), cullAct},
		{"used since the warning: cancelled", with(func(in *cullInput) {
			in.state = expired
			in.lastActivity = now.Add(-time.Minute)
		}), cullCancel},
		{"kept by its user since the warning: cancelled", with(func(in *cullInput) {
			in.state = expired
			in.state.keptAt = now.Add(-time.Minute)
		}), cullCancel},
		{"kept before the warning: the warning stands", with(func(in *cullInput) {
			in.state = expired
			in.state.keptAt = idle2h.Add(-time.Minute)
		}), cullAct},
		{"busy: never", with(func(in *cullInput) { in.execState = "busy" }), cullNothing},
		{"busy after a warning: cancelled", with(func(in *cullInput) { in.execState = "busy"; in.state = expired }), cullCancel},
		{"starting: never", with(func(in *cullInput) { in.execState = "starting" }), cullNothing},
		{"under the memory minimum: never", with(func(in *cullInput) { in.bytes = 1<<30 - 1 }), cullNothing},
		{"not idle long enough", with(func(in *cullInput) { in.lastActivity = now.Add(-59 * time.Minute) }), cullNothing},
		{"no server: never, and said", with(func(in *cullInput) { in.hasServer = false }), cullUnknown},
		{"no activity known", with(func(in *cullInput) { in.lastActivity = time.Time{} }), cullUnknown},
		{"exempt user", with(func(in *cullInput) { in.user = "carol" }), cullNothing},
		{"already culled, not used since", with(func(in *cullInput) { in.state = cullState{doneAt: idle2h} }), cullNothing},
		{"culled, used, idle again", with(func(in *cullInput) { in.state = cullState{doneAt: idle2h.Add(-time.Hour)} }), cullWarnNow},
		// Work on a GPU is use, whatever the server's last_activity says.
		{"its processes computed within --cull-idle: never", with(func(in *cullInput) { in.computedAt = now.Add(-10 * time.Minute) }), cullNothing},
		{"computed since the warning: withdrawn", with(func(in *cullInput) {
			in.state = warned
			in.computedAt = now.Add(-time.Minute)
		}), cullCancel},
		{"computed past --cull-idle ago: warned", with(func(in *cullInput) { in.computedAt = now.Add(-90 * time.Minute) }), cullWarnNow},
		{"warned after its last work on a GPU: no withdrawal, no new warning", with(func(in *cullInput) {
			in.computedAt = now.Add(-90 * time.Minute)
			in.state = cullState{warnedAt: now.Add(-time.Minute), deadline: now.Add(9 * time.Minute), activityAtWarn: in.computedAt}
		}), cullNothing},
		{"its GPU work not judged yet (too few readings): not warned yet", with(func(in *cullInput) { in.settling = true }), cullNothing},
		{"not judged yet, but already warned: the warning runs its course", with(func(in *cullInput) {
			in.settling = true
			in.state = expired
		}), cullAct},
		{"culled after its last work, not used since", with(func(in *cullInput) {
			in.computedAt = now.Add(-90 * time.Minute)
			in.state = cullState{doneAt: in.computedAt}
		}), cullNothing},
	}
	for _, tc := range tests {
		got, why, _ := cfg.decide(tc.in)
		if strings.HasPrefix(tc.name, "kept by") && why != "kept by its user" {
			t.Errorf("%s: reason %q, want \"kept by its user\"", tc.name, why)
		}
		if got != tc.want {
			t.Errorf("%s: verdict %d (%s), want %d", tc.name, got, why, tc.want)
		}
	}
	only := CullConfig{Idle: time.Hour, Action: CullReport, Users: []string{"bob"}}
	if got, _, _ := only.decide(base); got != cullNothing {
		t.Errorf("--cull-users=bob culls alice: %d", got)
	}
}

// The GPU-idle rule judges by GPU work alone: a kernel whose cells run
// every minute (a keep-alive) but whose processes did no GPU work for the
// rule's time is warned and culled; GPU work or a keep cancels; a running
// cell only delays the act; missing facts never cull.
func TestCullDecideGPUIdle(t *testing.T) {
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	cfg := CullConfig{GPUIdle: time.Hour, MinMemory: 1 << 30, Action: CullShutdown, Warn: 10 * time.Minute}
	gpuIdle2h := now.Add(-2 * time.Hour)
	warned := cullState{warnedAt: now.Add(-5 * time.Minute), deadline: now.Add(5 * time.Minute), activityAtWarn: gpuIdle2h, gpuRule: true}
	expired := cullState{warnedAt: now.Add(-11 * time.Minute), deadline: now.Add(-time.Minute), activityAtWarn: gpuIdle2h, gpuRule: true}
	// A keep-alive: a cell a minute ago, the server's last_activity with it.
	base := cullInput{now: now, hasServer: true, execState: "idle", lastActivity: now.Add(-time.Minute), bytes: 40 << 30,
		user: "alice", gpuIdleSince: gpuIdle2h}
	with := func(f func(*cullInput)) cullInput { in := base; f(&in); return in }
	tests := []struct {
		name    string
		in      cullInput
		want    cullVerdict
		gpuRule bool
	}{
		{"a keep-alive kernel with no GPU work: warned", base, cullWarnNow, true},
		{"within the warning", with(func(in *cullInput) { in.state = warned }), cullNothing, true},
		{"warning over: act, whatever its cells", with(func(in *cullInput) { in.state = expired }), cullAct, true},
		{"warning over while a cell runs: not now, not withdrawn", with(func(in *cullInput) {
			in.state, in.execState = expired, "busy"
		}), cullNothing, true},
		{"GPU work since the warning: withdrawn", with(func(in *cullInput) {
			in.state, in.gpuIdleSince = expired, now.Add(-time.Minute)
		}), cullCancel, true},
		{"kept since the warning: withdrawn", with(func(in *cullInput) {
			in.state, in.gpuIdleSince = expired, now.Add(-time.Minute)
			in.state.keptAt = in.gpuIdleSince
		}), cullCancel, true},
		{"computes now (no idle spell): never", with(func(in *cullInput) { in.gpuIdleSince = time.Time{} }), cullNothing, true},
		{"computes now, after a warning: withdrawn", with(func(in *cullInput) {
			in.state, in.gpuIdleSince = warned, time.Time{}
		}), cullCancel, true},
		{"GPU work within --cull-gpu-idle: never", with(func(in *cullInput) { in.gpuIdleSince = now.Add(-59 * time.Minute) }), cullNothing, true},
		{"under the memory minimum: never", with(func(in *cullInput) { in.bytes = 1<<30 - 1 }), cullNothing, true},
		{"no server: never, and said", with(func(in *cullInput) { in.hasServer = false }), cullUnknown, true},
		{"already culled, no GPU work since", with(func(in *cullInput) { in.state = cullState{doneAt: gpuIdle2h} }), cullNothing, true},
		{"culled, computed, idle again", with(func(in *cullInput) { in.state = cullState{doneAt: gpuIdle2h.Add(-time.Hour)} }), cullWarnNow, true},
	}
	for _, tc := range tests {
		got, why, gpuRule := cfg.decide(tc.in)
		if strings.HasPrefix(tc.name, "kept") && why != "kept by its user" {
			t.Errorf("%s: reason %q, want \"kept by its user\"", tc.name, why)
		}
		if got != tc.want || gpuRule != tc.gpuRule {
			t.Errorf("%s: verdict %d (%s, GPU-idle rule %v), want %d", tc.name, got, why, gpuRule, tc.want)
		}
	}
	// Both rules on: the idle rule still culls a kernel unused for its
	// time whose GPU work is unknown; a warning stands under the rule
	// that gave it.
	both := cfg
	both.Idle = 3 * time.Hour
	unknown := with(func(in *cullInput) { in.gpuIdleSince, in.lastActivity = time.Time{}, now.Add(-4*time.Hour) })
	if got, _, gpuRule := both.decide(unknown); got != cullWarnNow || gpuRule {
		t.Errorf("idle rule beside the GPU-idle rule: %d, GPU-idle rule %v; want a warning by the idle rule", got, gpuRule)
	}
	idleWarned := with(func(in *cullInput) {
		in.gpuIdleSince, in.lastActivity = time.Time{}, now.Add(-4*time.Hour)
		in.state = cullState{warnedAt: now.Add(-time.Minute), deadline: now.Add(9 * time.Minute), activityAtWarn: in.lastActivity}
	})
	if got, _, gpuRule := both.decide(idleWarned); got != cullNothing || gpuRule {
		t.Errorf("an idle rule's warning: %d, GPU-idle rule %v; want it to stand under the idle rule", got, gpuRule)
	}
	if (CullConfig{GPUIdle: time.Hour, Action: CullShutdown}).Validate() == nil {
		t.Error("--cull-gpu-idle without --cull-min-memory validated")
	}
}

// A GPU-idle cull that would shut a kernel down frees its caches first,
// once per spell without GPU work, and is warned of each in turn.
func TestCullGPUIdleFreesFirst(t *testing.T) {
	spell := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := cullState{gpuRule: true}
	if got := s.nextAction(CullShutdown, spell); got != CullFree {
		t.Errorf("first act of a spell: %s, want free", got)
	}
	s.freedFor = spell
	if got := s.nextAction(CullShutdown, spell); got != CullShutdown {
		t.Errorf("after the free: %s, want shutdown", got)
	}
	if got := s.nextAction(CullShutdown, spell.Add(time.Hour)); got != CullFree {
		t.Errorf("a new spell (GPU work since): %s, want free first again", got)
	}
	if got := (cullState{}).nextAction(CullShutdown, spell); got != CullShutdown {
		t.Errorf("the idle rule: %s, want shutdown", got)
	}
	var st cullState
	at := spell.Add(2 * time.Hour)
	if got := st.gpuIdleSince(at, attribution.ComputeComputing, time.Time{}); !got.IsZero() {
		t.Errorf("computing: idle since %v", got)
	}
	if got := st.gpuIdleSince(at, attribution.ComputeIdle, spell); !got.Equal(at) {
		t.Errorf("first idle verdict: since %v, want %v (its first idle verdict, after its last work)", got, at)
	}
	st.keptAt = at.Add(time.Minute)
	if got := st.gpuIdleSince(at.Add(2*time.Minute), attribution.ComputeIdle, spell); !got.Equal(st.keptAt) {
		t.Errorf("kept: since %v, want the keep", got)
	}
	if got := st.gpuIdleSince(at, attribution.ComputeUnknown, spell); !got.IsZero() || !st.judgedIdleFrom.IsZero() {
		t.Errorf("unknown: since %v, spell from %v", got, st.judgedIdleFrom)
	}
}

func TestCullConfig(t *testing.T) {
	for _, c := range []CullConfig{{Idle: time.Hour, Action: "explode"}, {Idle: time.Hour, Action: CullFree, Warn: -1}} {
		if c.Validate() == nil {
			t.Errorf("%+v validated", c)
		}
	}
	if (CullConfig{}).Validate() != nil || (CullConfig{}).Enabled() {
		t.Error("culling off by default")
	}
	if s := (CullConfig{Idle: time.Hour, Action: CullFree, MinMemory: 1 << 30, Users: []string{"a"}, ExemptUsers: []string{"b"}}).summary(); !strings.Contains(s, "free after 1 h idle") || !strings.Contains(s, "exempt b") {
		t.Errorf("summary %q", s)
	}
}
