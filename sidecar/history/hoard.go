package history

import (
	"sort"
	"sync"
	"time"
)

// Hoard adds up, per notebook (its key: the daemon gives a kernel's
// connection file, its identity), the GPU memory held while
// computing nothing, in byte-seconds, over the last Window: who holds a GPU
// without using it. Each notebook keeps one bucket of HoardStep at most per
// step of the window (288 of 16 bytes for 24 h), so the window's edge moves
// by whole steps. A notebook's figure is known once one of its readings in
// the window was judged (computing ones add 0); its user's figure sums
// every notebook of theirs in the window, those gone since included.
//
// Like Store it is bookkeeping only: no clock (every call is given the
// time), no I/O. It is safe for concurrent use.
type Hoard struct {
	window time.Duration
	step   int64 // seconds

	mu      sync.Mutex
	notes   map[string]*hoarded
	trimmed int64 // the bucket start of the last trim: one trim a bucket
}

// HoardStep is a Hoard bucket's length.
const HoardStep = 5 * time.Minute

type hoarded struct {
	user    string
	buckets []hoardBucket // oldest first
}

type hoardBucket struct {
	start       int64 // unix seconds, a multiple of step
	byteSeconds float64
}

// NewHoard returns an empty Hoard over window (default 24 h).
func NewHoard(window time.Duration) *Hoard {
	if window <= 0 {
		window = 24 * time.Hour
	}
	return &Hoard{window: window, step: int64(HoardStep / time.Second), notes: map[string]*hoarded{}}
}

// Window is the span the figures cover.
func (h *Hoard) Window() time.Duration { return h.window }

// Add records that notebook key (of user) held byteSeconds of GPU memory
// while computing nothing at now; 0 records a judged reading that hoarded
// nothing (it computed, or held nothing).
func (h *Hoard) Add(now time.Time, key, user string, byteSeconds float64) {
	t := now.Unix()
	start := t - t%h.step
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.notes[key]
	if n == nil {
		n = &hoarded{}
		h.notes[key] = n
	}
	if user != "" {
		n.user = user
	}
	if k := len(n.buckets) - 1; k >= 0 && n.buckets[k].start == start {
		n.buckets[k].byteSeconds += byteSeconds
	} else if k < 0 || n.buckets[k].start < start {
		n.buckets = append(n.buckets, hoardBucket{start: start, byteSeconds: byteSeconds})
	}
	h.trimLocked(t)
}

// trimLocked drops the buckets that ended before the window, and the
// notebooks left with none: once a bucket, since the window moves by
// whole buckets.
func (h *Hoard) trimLocked(t int64) {
	if start := t - t%h.step; start > h.trimmed {
		h.trimmed = start
	} else {
		return
	}
	horizon := t - int64(h.window/time.Second)
	for key, n := range h.notes {
		i := 0
		for i < len(n.buckets) && n.buckets[i].start+h.step <= horizon {
			i++
		}
		n.buckets = n.buckets[i:]
		if len(n.buckets) == 0 {
			delete(h.notes, key)
		}
	}
}

// Notebook is key's byte-seconds over the window; ok is false when none
// of its readings in the window was judged.
func (h *Hoard) Notebook(now time.Time, key string) (byteSeconds float64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trimLocked(now.Unix())
	n := h.notes[key]
	if n == nil {
		return 0, false
	}
	for _, b := range n.buckets {
		byteSeconds += b.byteSeconds
	}
	return byteSeconds, true
}

// UserHoard is one user's byte-seconds over the window.
type UserHoard struct {
	User        string
	ByteSeconds float64
}

// Users sums the notebooks per user, the largest first (ties by name).
// Notebooks of no known user count as "unknown".
func (h *Hoard) Users(now time.Time) []UserHoard {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trimLocked(now.Unix())
	by := map[string]float64{}
	for _, n := range h.notes {
		u := n.user
		if u == "" {
			u = "unknown"
		}
		sum := by[u]
		for _, b := range n.buckets {
			sum += b.byteSeconds
		}
		by[u] = sum
	}
	out := make([]UserHoard, 0, len(by))
	for u, bs := range by {
		out = append(out, UserHoard{User: u, ByteSeconds: bs})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ByteSeconds != out[j].ByteSeconds {
			return out[i].ByteSeconds > out[j].ByteSeconds
		}
		return out[i].User < out[j].User
	})
	return out
}
