package protocol

import (
	"fmt"
	"testing"
)

func TestShellWork(t *testing.T) {
	exec := func(id string) Header { return Header{MsgID: id, MsgType: "execute_request", Session: "frontend"} }
	sub := func(id string) Header {
		return Header{MsgID: id, MsgType: "execute_request", Session: "other", SubshellID: "sub-1"}
	}
	other := func(id, typ string) Header { return Header{MsgID: id, MsgType: typ, Session: "other"} }
	type step struct {
		parent Header
		state  string
		want   string // state() after this status
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"nothing seen", []step{{other("k", "kernel_info_request"), "idle", ""}}},
		{"a cell", []step{{exec("a"), "busy", "busy"}, {exec("a"), "idle", "idle"}}},
		{"another session's kernel_info on control", []step{
			{exec("a"), "busy", "busy"},
			{other("k", "kernel_info_request"), "busy", "busy"},
			{other("k", "kernel_info_request"), "idle", "busy"},
			{exec("a"), "idle", "idle"},
		}},
		{"a subshell created and used", []step{
			{exec("a"), "busy", "busy"},
			{other("c", "create_subshell_request"), "busy", "busy"},
			{other("c", "create_subshell_request"), "idle", "busy"},
			{sub("s"), "busy", "busy"},
			{sub("s"), "idle", "busy"},
			{exec("a"), "idle", "idle"},
		}},
		{"a subshell's execute alone is not the main shell's", []step{
			{sub("s"), "busy", ""}, {sub("s"), "idle", ""},
		}},
		{"gpumem attach: kernel_info, then an execute queued behind the cell", []step{
			{exec("cell"), "busy", "busy"},
			{other("k", "kernel_info_request"), "idle", "busy"},
			{exec("cell"), "idle", "idle"},
			{exec("inject"), "busy", "busy"},
			{exec("inject"), "idle", "idle"},
		}},
		{"control requests", []step{
			{exec("a"), "busy", "busy"},
			{other("i", "interrupt_request"), "idle", "busy"},
			{other("u", "usage_request"), "idle", "busy"},
			{other("d", "debug_request"), "idle", "busy"},
			{other("m", "comm_info_request"), "idle", "busy"},
			{other("m", "comm_msg"), "idle", "busy"},
			{other("h", "history_request"), "idle", "busy"},
		}},
		{"an execute on control beside a cell", []step{
			{exec("cell"), "busy", "busy"},
			{exec("ctl"), "busy", "busy"},
			{exec("ctl"), "idle", "busy"},
			{exec("cell"), "idle", "idle"},
		}},
		{"an idle of a request never seen busy (attached mid-cell)", []step{
			{exec("old"), "idle", "idle"},
			{exec("next"), "busy", "busy"},
		}},
		{"starting and unknown states change nothing", []step{
			{exec("a"), "busy", "busy"},
			{exec("a"), "starting", "busy"},
			{exec("a"), "", "busy"},
			{exec("a"), "idle", "idle"},
		}},
		{"a parent without msg_id", []step{{Header{MsgType: "execute_request"}, "busy", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w shellWork
			for i, s := range tc.steps {
				w.status(s.parent, s.state)
				if got := w.state(); got != s.want {
					t.Fatalf("after step %d (%s %s %q): state %q, want %q", i, s.parent.MsgType, s.parent.MsgID, s.state, got, s.want)
				}
			}
		})
	}
}

// More requests busy at once than can be tracked: busy until the next
// generation, never idle by mistake.
func TestShellWorkOverflow(t *testing.T) {
	var w shellWork
	for i := range maxRunning + 1 {
		w.status(Header{MsgID: fmt.Sprint(i), MsgType: "execute_request"}, "busy")
	}
	for i := range maxRunning {
		w.status(Header{MsgID: fmt.Sprint(i), MsgType: "execute_request"}, "idle")
	}
	if got := w.state(); got != "busy" {
		t.Fatalf("state %q after an untracked request, want busy", got)
	}
}

// Only the main shell's statuses count as its use (their time is when the
// kernel was last used): an execute's busy and idle, never a control
// request's, a subshell's or kernel_info's.
func TestShellWorkCountsOnlyTheMainShell(t *testing.T) {
	var w shellWork
	for _, tc := range []struct {
		parent Header
		want   bool
	}{
		{Header{MsgID: "a", MsgType: "execute_request"}, true},
		{Header{MsgID: "s", MsgType: "execute_request", SubshellID: "sub-1"}, false},
		{Header{MsgID: "c", MsgType: "create_subshell_request"}, false},
		{Header{MsgID: "k", MsgType: "kernel_info_request"}, false},
		{Header{MsgType: "execute_request"}, false},
	} {
		for _, state := range []string{"busy", "idle"} {
			if got := w.status(tc.parent, state); got != tc.want {
				t.Errorf("%s %q (subshell %q) %s: counted %v, want %v", tc.parent.MsgType, tc.parent.MsgID, tc.parent.SubshellID, state, got, tc.want)
			}
		}
	}
}
