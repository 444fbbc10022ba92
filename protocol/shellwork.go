package protocol

// shellWork follows the main shell's work from the kernel's status
// messages: the main shell is busy from an execute_request's "busy" until
// the "idle" whose parent is that same request. Every other status leaves
// it as it is: those of control requests (kernel_info, interrupt,
// create_subshell: answered while a cell runs), of a subshell's requests
// (JEP 91: their header names a subshell_id, and they run beside the main
// shell), of kernel_info on shell, of comms. Nothing but the idle of the
// very request clears a busy, so another client's requests, or gpumem's
// own attach, can never make a running cell look idle.
//
// Several requests may be between busy and idle at once (an execute sent
// on control, which ipykernel accepts, runs beside a cell): each is
// tracked by its msg_id. It is pure and owned by one goroutine (the
// client's iopub reader, one per generation of sockets: a reconnect starts
// afresh, with what it missed unknown).
type shellWork struct {
	seen    bool                // a main-shell execute's status was seen
	running map[string]struct{} // msg_ids between busy and idle
	// overflow is set when more than maxRunning requests were busy at
	// once: their idles can no longer be matched, so the shell counts as
	// busy until the next generation (never culled wrongly; a kernel that
	// floods its own statuses only keeps itself from being culled).
	overflow bool
}

// maxRunning bounds the requests tracked at once: a real kernel has one
// cell running and perhaps one control execute beside it.
const maxRunning = 64

// status records a status message: its parent header and execution_state.
// It reports whether the message was the main shell's (an execute's busy or
// idle): its time is when the kernel was last used.
func (w *shellWork) status(parent Header, state string) bool {
	if parent.MsgType != "execute_request" || parent.SubshellID != "" || parent.MsgID == "" {
		return false
	}
	switch state {
	case "busy":
		w.seen = true
		if w.running == nil {
			w.running = map[string]struct{}{}
		}
		if _, ok := w.running[parent.MsgID]; !ok && len(w.running) >= maxRunning {
			w.overflow = true
			return true
		}
		w.running[parent.MsgID] = struct{}{}
	case "idle":
		w.seen = true
		delete(w.running, parent.MsgID)
	}
	return true
}

// state is "busy" while a main-shell execute runs, "idle" once one was
// seen and none runs, "" before any was seen.
func (w *shellWork) state() string {
	switch {
	case len(w.running) > 0 || w.overflow:
		return "busy"
	case w.seen:
		return "idle"
	}
	return ""
}
