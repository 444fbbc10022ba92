package history

import (
	"fmt"
	"sync"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/oom"
)

// Event is something a user should hear about once: the end of a
// restarted or shut-down kernel's orphans ("reclaim"), one of them left
// running because it computes on a GPU ("left_running"), an out-of-memory
// error in a kernel ("oom"), or a memory snapshot reduced ("snapshot": its
// Reason is the snapshot's id, Bytes its file's size).
type Event struct {
	Seq      uint64 `json:"seq"`  // increasing from 1: a reader asks for what came after
	Time     int64  `json:"time"` // unix seconds
	Kind     string `json:"kind"` // "reclaim", "left_running", "oom" or "snapshot"
	KernelID string `json:"kernel_id"`
	// ConnectionFile is the kernel's identity (ids are not unique).
	ConnectionFile string `json:"connection_file,omitempty"`
	Notebook       string `json:"notebook"`
	User           string `json:"user"`
	Reason         string `json:"reason"` // "restart" or "shutdown"
	// Processes ended (or left running) and the GPU memory they held.
	Processes int    `json:"processes"`
	Bytes     uint64 `json:"bytes"`
	// PID and StartTime name the process left running (with its
	// kernel, what ending it asks for). Message is the sentence every
	// face shows of a "left_running" or "reclaim" event (ReclaimMessage).
	PID       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"start_time,omitempty"`
	Message   string `json:"message,omitempty"`
	// OOM is the out-of-memory event (kind "oom"); Bytes is then its
	// request and Reason its headline.
	OOM *oom.Event `json:"oom,omitempty"`
}

// ReclaimMessage is a reclaim event's sentence: what was ended, of which
// notebook (attribution.KernelName), holding how much, after what (why:
// "restart" or "shutdown"). Like the report's sentences it is English; the
// faces show it as it is.
func ReclaimMessage(notebook, kernelID, why string, processes int, bytes uint64) string {
	what := "1 orphan"
	if processes != 1 {
		what = fmt.Sprintf("%d orphans", processes)
	}
	after := "the restart"
	if why == "shutdown" {
		after = "the shutdown"
	}
	return fmt.Sprintf("Ended %s of %s holding %s after %s", what, attribution.KernelName(notebook, kernelID), units.Bytes(bytes), after)
}

// Events keeps the last Capacity events. It is safe for concurrent use.
type Events struct {
	mu   sync.Mutex
	ring []Event
	next uint64
}

// EventCapacity is how many events are kept; older ones are dropped.
const EventCapacity = 256

// NewEvents returns an empty event log.
func NewEvents() *Events { return &Events{next: 1} }

// Add stores e, giving it the next sequence number, which it returns.
func (l *Events) Add(e Event) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Seq = l.next
	l.next++
	if e.OOM != nil { // the event's own copy, numbered like it
		o := *e.OOM
		o.Seq = e.Seq
		e.OOM = &o
	}
	if len(l.ring) == EventCapacity {
		copy(l.ring, l.ring[1:])
		l.ring = l.ring[:EventCapacity-1]
	}
	l.ring = append(l.ring, e)
	return e.Seq
}

// After returns the events with Seq > seq, oldest first, and the last
// sequence number given so far.
func (l *Events) After(seq uint64) ([]Event, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []Event{}
	for _, e := range l.ring {
		if e.Seq > seq {
			out = append(out, e)
		}
	}
	return out, l.next - 1
}
