package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// childrenBackend records the confirmed pids each free --children hands
// over.
type childrenBackend struct{ whyBackend }

func (b *childrenBackend) FreeChildren(_ context.Context, k KernelRef, fromKernel bool, req FreeChildrenRequest) (json.RawMessage, error) {
	b.record(fmt.Sprintf("children %s from_kernel=%v pids=%v", k.ConnectionFile, fromKernel, req.PIDs))
	if err := b.known(k); err != nil {
		return nil, err
	}
	return json.RawMessage(`{"kind":"children","ended":[]}`), nil
}

// The body of POST .../children/free is optional, strict and bounded: the
// pids it confirms reach the backend as sent, and a body that is not a
// list of distinct process ids is refused before any backend call.
func TestFreeChildrenConfirmedPIDs(t *testing.T) {
	b := &childrenBackend{whyBackend{fakeBackend: fakeBackend{report: testReport()}}}
	ts := startServer(t, "", ModePrivate, b)
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	many := make([]string, maxConfirmPIDs+1)
	for i := range many {
		many[i] = fmt.Sprint(i + 1)
	}
	const path = "/api/v1/kernels/kernel-a/children/free"
	tests := []struct {
		header  http.Header
		body    string
		status  int
		bodyHas string
	}{
		{nil, "", 200, `"kind":"children"`},
		{jsonCT, `{"pids":[1234,77]}`, 200, `"kind":"children"`},
		{jsonCT, `{}`, 200, `"kind":"children"`},
		{jsonCT, `{"pids":[1234],"all":true}`, 400, `unknown field`},
		{jsonCT, `{"pids":[0]}`, 400, "0 is not a process id"},
		{jsonCT, `{"pids":[-5]}`, 400, "-5 is not a process id"},
		{jsonCT, `{"pids":[9,9]}`, 400, "pid 9 is named twice"},
		{jsonCT, `{"pids":["9"]}`, 400, "cannot unmarshal"},
		{jsonCT, `{"pids":[` + strings.Join(many, ",") + `]}`, 400, "at most 1024"},
		{jsonCT, `{"pids":[` + strings.Repeat("1,", maxFreeBody) + `1]}`, 413, "over"},
		{nil, `{"pids":[1]}`, 415, "application/json"},
	}
	for _, tc := range tests {
		r := rawDo(t, ts.path, "POST", path, SocketHost, tc.header, tc.body)
		if r.status != tc.status || !strings.Contains(string(r.body), tc.bodyHas) {
			t.Errorf("POST %s %.80s = %d %.200s, want %d containing %q", path, tc.body, r.status, r.body, tc.status, tc.bodyHas)
		}
	}
	a := connFileOf("kernel-a")
	want := "children " + a + " from_kernel=false pids=[]; children " + a + " from_kernel=false pids=[1234 77]; children " + a + " from_kernel=false pids=[]"
	if got := b.got(); got != want {
		t.Errorf("backend calls:\n got %s\nwant %s", got, want)
	}
}

// The client sends no body without pids, and refuses a bad list itself.
func TestClientFreeChildrenValidates(t *testing.T) {
	c := NewClient("/nonexistent/gpumem.sock")
	defer c.Close()
	if _, err := c.FreeChildren(context.Background(), "k", FreeChildrenRequest{PIDs: []int{3, 3}}); err == nil || !strings.Contains(err.Error(), "named twice") {
		t.Errorf("FreeChildren with a repeated pid: %v, want it refused before any request", err)
	}
}
