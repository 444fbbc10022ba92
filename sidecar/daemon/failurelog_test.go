package daemon

import (
	"testing"
	"time"
)

func TestFailureLog(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at       time.Duration
		msg      string // "" for a success
		log      bool
		unlogged int // for a failure; for a success, the run's length
	}
	steps := []step{
		{0, "nvml: gpu is lost", true, 0},
		{time.Second, "nvml: gpu is lost", false, 0},
		{2 * time.Second, "nvml: gpu is lost", false, 0},
		{3 * time.Second, "read /proc: too many open files", true, 2}, // a new message
		{4 * time.Second, "read /proc: too many open files", false, 0},
		{63 * time.Second, "read /proc: too many open files", true, 1}, // a minute on
		{64 * time.Second, "", false, 6},                               // recovered after 6
		{65 * time.Second, "read /proc: too many open files", true, 0}, // a new run logs at once
	}
	var f failureLog
	for i, s := range steps {
		if s.msg == "" {
			if n := f.ok(); n != s.unlogged {
				t.Errorf("step %d: recovered after %d failures, want %d", i, n, s.unlogged)
			}
			continue
		}
		log, unlogged := f.fail(t0.Add(s.at), s.msg)
		if log != s.log || unlogged != s.unlogged {
			t.Errorf("step %d (%s at %v): log %v with %d unlogged, want %v with %d", i, s.msg, s.at, log, unlogged, s.log, s.unlogged)
		}
	}
}
