package protocol

import (
	"fmt"
	"time"
)

// Event reports a change in the kernel's life, delivered on Client.Events().
type Event struct {
	Kind    EventKind
	Session string // kernel session id (EventConnected, EventRestarted, EventReconnected)
	Err     error  // cause (EventDisconnected, EventDead, EventClosed)
	Time    time.Time
}

func (e Event) String() string {
	s := e.Kind.String()
	if e.Session != "" {
		s += " session=" + e.Session
	}
	if e.Err != nil {
		s += fmt.Sprintf(" err=%q", e.Err.Error())
	}
	return s
}

// EventKind enumerates Client events.
type EventKind int

const (
	// EventConnected: the first attach (Dial) succeeded.
	EventConnected EventKind = iota
	// EventDisconnected: a socket hit EOF or a heartbeat was missed; the
	// client has closed every socket and is reconnecting.
	EventDisconnected
	// EventRestarted: reconnected, and the kernel's session id changed (a
	// new kernel process behind the same connection file).
	EventRestarted
	// EventReconnected: reconnected to the same kernel session (a transient
	// outage).
	EventReconnected
	// EventDead: while reconnecting, nothing listens on the kernel's ports:
	// the process is presumed dead. Sent once per outage; the client keeps
	// trying, so EventRestarted may follow.
	EventDead
	// EventClosed: the client stopped, because Close was called (Err nil) or
	// the connection file was deleted (Err wraps ErrConnectionFileDeleted).
	// It is the last event; Events() is closed by Close.
	EventClosed
)

func (k EventKind) String() string {
	switch k {
	case EventConnected:
		return "connected"
	case EventDisconnected:
		return "disconnected"
	case EventRestarted:
		return "restarted"
	case EventReconnected:
		return "reconnected"
	case EventDead:
		return "dead"
	case EventClosed:
		return "closed"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}
