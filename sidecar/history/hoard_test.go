package history

import (
	"testing"
	"time"
)

func TestHoard(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	h := NewHoard(time.Hour)
	if _, ok := h.Notebook(t0, "k1"); ok {
		t.Fatal("an unknown notebook is known")
	}
	// k1 (alice) hoards 1 GiB for 10 minutes, a second at a time; k2
	// (alice) computes (judged, 0); k3 (bob) hoards 2 GiB for a minute.
	for i := range 600 {
		now := t0.Add(time.Duration(i) * time.Second)
		h.Add(now, "k1", "alice", 1<<30)
		h.Add(now, "k2", "alice", 0)
		if i < 60 {
			h.Add(now, "k3", "bob", 2<<30)
		}
	}
	now := t0.Add(10 * time.Minute)
	if bs, ok := h.Notebook(now, "k1"); !ok || bs != 600*(1<<30) {
		t.Errorf("k1: %v %v, want 600 GiB·s", bs, ok)
	}
	if bs, ok := h.Notebook(now, "k2"); !ok || bs != 0 {
		t.Errorf("k2 (computing): %v %v, want a known 0", bs, ok)
	}
	users := h.Users(now)
	if len(users) != 2 || users[0].User != "alice" || users[0].ByteSeconds != 600*(1<<30) ||
		users[1].User != "bob" || users[1].ByteSeconds != 120*(1<<30) {
		t.Errorf("users: %+v", users)
	}
	// An hour and a bucket later everything has left the window.
	later := now.Add(time.Hour + HoardStep)
	if _, ok := h.Notebook(later, "k1"); ok {
		t.Error("k1 still known after the window")
	}
	if u := h.Users(later); len(u) != 0 {
		t.Errorf("users after the window: %+v", u)
	}
	// A time before the last bucket adds nothing (a clock set back).
	h.Add(later, "k4", "carol", 1)
	h.Add(later.Add(-time.Hour), "k4", "carol", 5)
	if bs, _ := h.Notebook(later, "k4"); bs != 1 {
		t.Errorf("k4: %v, want 1", bs)
	}
}

// One bucket a step: a day of a thousand notebooks stays small.
func TestHoardIsSmall(t *testing.T) {
	h := NewHoard(24 * time.Hour)
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for m := range 48 * 60 { // two days, one reading a minute
		now := t0.Add(time.Duration(m) * time.Minute)
		for k := range 10 {
			h.Add(now, string(rune('a'+k)), "u", 1)
		}
	}
	for key, n := range h.notes {
		if len(n.buckets) > int(24*time.Hour/HoardStep)+1 {
			t.Fatalf("%s keeps %d buckets", key, len(n.buckets))
		}
	}
}
