package daemon

import (
	"strings"
	"testing"
	"time"
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
		got, why := cfg.decide(tc.in)
		if strings.HasPrefix(tc.name, "kept by") && why != "kept by its user" {
			t.Errorf("%s: reason %q, want \"kept by its user\"", tc.name, why)
		}
		if got != tc.want {
			t.Errorf("%s: verdict %d (%s), want %d", tc.name, got, why, tc.want)
		}
	}
	only := CullConfig{Idle: time.Hour, Action: CullReport, Users: []string{"bob"}}
	if got, _ := only.decide(base); got != cullNothing {
		t.Errorf("--cull-users=bob culls alice: %d", got)
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
