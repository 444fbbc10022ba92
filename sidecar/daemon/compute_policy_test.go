package daemon

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// readings builds one reading a second from start: each "a" active (90 %
// SM), "." idle (0), "?" unknown, "m" memory-bound (0 % SM, 40 % memory),
// "l" light (1 % SM), "t" a trickle (0 % SM, 0 % memory, but listed).
func readings(start time.Time, pattern string) []utilSample {
	var out []utilSample
	for i, c := range pattern {
		s := utilSample{at: atTime(start.Add(time.Duration(i) * time.Second)), known: true}
		switch c {
		case 'a':
			s.sm, s.mem = 90, 10
		case '?':
			s.known = false
		case 'm':
			s.mem = 40
		case 'l':
			s.sm = 1
		}
		out = append(out, s)
	}
	return out
}

func TestJudge(t *testing.T) {
	policy := ComputeConfig{}
	policy.defaults()
	exit := t0.Add(30 * time.Second)
	tests := []struct {
		name     string
		samples  []utilSample
		from, to time.Time
		want     computeVerdict
		wantWhy  string
		settling bool // unknown for want of readings only
	}{
		{name: "computing", samples: readings(t0, "aaaaaaaaaa"), want: verdictComputing},
		{name: "idle: holds memory, computes nothing", samples: readings(t0, ".........."), want: verdictIdle},
		{name: "unknown: the GPU cannot say", samples: readings(t0, "??????????"), want: verdictUnknown, wantWhy: "unknown in 10 of 10"},
		{name: "a single noisy reading does not make it busy", samples: readings(t0, "..............a..............."), want: verdictIdle},
		{name: "a single quiet reading does not make it idle", samples: readings(t0, "aaaaa.aaaa"), want: verdictComputing},
		{name: "bursty work: two readings in a minute", samples: readings(t0, "a..........................a.........."), want: verdictComputing},
		{name: "memory-bound work computes", samples: readings(t0, "mmmm"), want: verdictComputing},
		{name: "1 % is at the threshold", samples: readings(t0, "llll"), want: verdictComputing},
		{name: "one active, one unknown: cannot say", samples: readings(t0, "....a.?..."), want: verdictUnknown},
		{name: "too few readings to call it idle", samples: readings(t0, ".."), want: verdictUnknown, wantWhy: "2 readings so far, 3 needed", settling: true},
		{name: "no reading at all", samples: nil, want: verdictUnknown, settling: true},
		{name: "starts computing during the grace period",
			samples: append(readings(t0, "..............................")[:30], readings(exit, "..aaa")...),
			from:    exit.Add(-time.Minute), to: exit.Add(5 * time.Second), want: verdictComputing},
		{name: "computed long before the window: idle now",
			samples: append(readings(t0.Add(-5*time.Minute), "aaaaa"), readings(t0, "..........")...),
			from:    t0, to: t0.Add(10 * time.Second), want: verdictIdle},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			from, to := tt.from, tt.to
			if from.IsZero() {
				from, to = t0.Add(-policy.Window), t0.Add(policy.Window)
			}
			j := policy.judge(tt.samples, from, to)
			if j.verdict != tt.want || !strings.Contains(j.why(), tt.wantWhy) {
				t.Errorf("verdict %v (%s), want %v (%q)", j.verdict, j.why(), tt.want, tt.wantWhy)
			}
			if j.verdict == verdictComputing && j.lastActive.IsZero() {
				t.Error("computing with no last active reading")
			}
			if j.settling != tt.settling {
				t.Errorf("settling %v, want %v", j.settling, tt.settling)
			}
		})
	}
}

// NVML keeps a reading as a process's figure for a while: two samples may
// both see the same one. It counts once, so one spike seen twice is still
// one spike; distinct readings count each.
func TestJudgeCountsAReadingOnce(t *testing.T) {
	policy := ComputeConfig{}
	policy.defaults()
	s := readings(t0, "..........")
	s[4].sm, s[4].reading = 100, 777
	s[5].sm, s[5].reading = 100, 777 // the same reading, seen again
	if j := policy.judge(s, t0, t0.Add(time.Minute)); j.verdict != verdictIdle {
		t.Errorf("one reading seen twice: %v (%s), want idle", j.verdict, j.why())
	}
	s[5].reading = 778
	if j := policy.judge(s, t0, t0.Add(time.Minute)); j.verdict != verdictComputing {
		t.Errorf("two readings: %v (%s), want computing", j.verdict, j.why())
	}
}

// A higher threshold ignores light work.
func TestJudgeThreshold(t *testing.T) {
	policy := ComputeConfig{ThresholdPercent: 5}
	policy.defaults()
	if j := policy.judge(readings(t0, "llllllllll"), t0, t0.Add(time.Minute)); j.verdict != verdictIdle {
		t.Errorf("1 %% under a 5 %% threshold: %v, want idle", j.verdict)
	}
}

func TestMayEnd(t *testing.T) {
	tests := []struct {
		verdict computeVerdict
		unknown string
		want    bool
		why     string
	}{
		{verdictIdle, ReclaimKeep, true, ""},
		{verdictComputing, ReclaimKeep, false, "computing on a GPU"},
		{verdictComputing, ReclaimEnd, false, "computing on a GPU"},
		{verdictUnknown, ReclaimKeep, false, "utilization is unknown"},
		{verdictUnknown, ReclaimEnd, true, ""},
	}
	for _, tt := range tests {
		c := ComputeConfig{ReclaimUnknown: tt.unknown}
		c.defaults()
		ok, why := c.mayEnd(judgement{verdict: tt.verdict})
		if ok != tt.want || !strings.Contains(why, tt.why) {
			t.Errorf("%v with --reclaim-unknown=%s: %v %q, want %v %q", tt.verdict, tt.unknown, ok, why, tt.want, tt.why)
		}
	}
}

func TestCombine(t *testing.T) {
	c, i, u := judgement{verdict: verdictComputing, lastActive: t0}, judgement{verdict: verdictIdle}, judgement{verdict: verdictUnknown}
	if got := combine([]judgement{c, {verdict: verdictUnknown, settling: true}}, true); got.settling {
		t.Error("a computing notebook is settling")
	}
	tests := []struct {
		name  string
		in    []judgement
		known bool
		want  computeVerdict
	}{
		{"a child computes: the notebook computes", []judgement{i, c, u}, true, verdictComputing},
		{"all idle", []judgement{i, i}, true, verdictIdle},
		{"one unknown among idle ones", []judgement{i, u}, true, verdictUnknown},
		{"no GPU process, GPUs that can say", nil, true, verdictIdle},
		{"no GPU process, GPUs that cannot", nil, false, verdictUnknown},
		{"a new process still settling, the rest idle", []judgement{i, {verdict: verdictUnknown, settling: true}}, true, verdictUnknown},
	}
	for _, tt := range tests {
		got := combine(tt.in, tt.known)
		if got.verdict != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got.verdict, tt.want)
		}
		if tt.want == verdictComputing && !got.lastActive.Equal(t0) {
			t.Errorf("%s: last active %v", tt.name, got.lastActive)
		}
		if wantSettling := strings.Contains(tt.name, "settling"); got.settling != wantSettling {
			t.Errorf("%s: settling %v", tt.name, got.settling)
		}
	}
}

func TestComputeConfigValidate(t *testing.T) {
	for _, c := range []ComputeConfig{{ReclaimUnknown: "maybe"}, {ThresholdPercent: 101}, {Window: -time.Second}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if err := (ComputeConfig{ReclaimUnknown: ReclaimEnd, ThresholdPercent: 5, Window: time.Minute}).Validate(); err != nil {
		t.Error(err)
	}
}

// whyLocked says what why says, whatever the judgement (each field changed
// in turn, lastActive too, which the words do not read), from memory or
// not, and past its bound.
func TestWhyFromMemory(t *testing.T) {
	base := judgement{verdict: verdictIdle, known: 30, active: 2, window: time.Minute, threshold: 5}
	variants := []func(j *judgement){
		func(j *judgement) {},
		func(j *judgement) { j.verdict = verdictComputing },
		func(j *judgement) { j.verdict = verdictUnknown },
		func(j *judgement) { j.verdict, j.settling = verdictUnknown, true },
		func(j *judgement) { j.verdict, j.unknown = verdictUnknown, 4 },
		func(j *judgement) { j.known++ },
		func(j *judgement) { j.active++ },
		func(j *judgement) { j.window = 2 * time.Minute },
		func(j *judgement) { j.threshold = 10 },
		func(j *judgement) { j.note = "a process not in /proc" },
		func(j *judgement) { j.lastActive = time.Unix(1e9, 0) },
	}
	c := newComputeState(ComputeConfig{}, time.Second, time.Second, time.Hour)
	for round := range 2 { // the second from memory
		for i, v := range variants {
			j := base
			v(&j)
			if got, want := c.whyLocked(j), j.why(); got != want {
				t.Errorf("round %d, variant %d: %q, want %q", round, i, got, want)
			}
		}
	}
	for i := range maxWhys + 10 {
		j := base
		j.known = i
		if got, want := c.whyLocked(j), j.why(); got != want {
			t.Fatalf("judgement %d: %q, want %q", i, got, want)
		}
	}
	if len(c.whys) > maxWhys {
		t.Errorf("%d judgements kept, bound %d", len(c.whys), maxWhys)
	}
}

// A reading's time is kept without a pointer and given back as the same
// instant, for the daemon's times (monotonic) and for others (wall clock
// only), in the same order.
func TestSampleTimeKeepsTheInstant(t *testing.T) {
	for _, tt := range []struct {
		name string
		t    time.Time
	}{
		{"now", time.Now()},
		{"now, later", time.Now().Add(90 * time.Second)},
		{"wall clock only", time.Unix(1e9, 5)},
		{"before the epoch", sampleEpoch.Add(-time.Hour)},
	} {
		if got := atTime(tt.t).Time(); !got.Equal(tt.t) {
			t.Errorf("%s: %v back as %v", tt.name, tt.t, got)
		}
		if a, b := atTime(tt.t), atTime(tt.t.Add(time.Nanosecond)); a >= b {
			t.Errorf("%s: %d not before %d", tt.name, a, b)
		}
	}
	if reflect.TypeFor[utilSample]().Size() > 32 {
		t.Errorf("utilSample is %d bytes", reflect.TypeFor[utilSample]().Size())
	}
}
