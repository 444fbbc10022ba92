package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/history"
)

// historyBackend adds the optional history and kernel-query interfaces.
type historyBackend struct {
	fakeBackend
	mu      sync.Mutex
	queries []HistoryQuery
	vars    []string
}

func (b *historyBackend) History(_ context.Context, q HistoryQuery) (HistoryResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queries = append(b.queries, q)
	return HistoryResponse{Now: 42, StepSeconds: 1, GPUs: []HistorySeries{{ID: "0", Points: [][2]uint64{{41, 7}}}},
		Notebooks: []HistorySeries{}, Report: testReport()}, nil
}

func (b *historyBackend) KernelVars(_ context.Context, k KernelRef, all bool) (json.RawMessage, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.vars = append(b.vars, fmt.Sprintf("%s %s all=%v", k.ID, k.ConnectionFile, all))
	return json.RawMessage(`{"kind":"vars","rows":[]}`), nil
}

func (b *historyBackend) KernelSummary(_ context.Context, _ KernelRef) (json.RawMessage, error) {
	return json.RawMessage(`{"kind":"summary"}`), nil
}

func rawGet(t *testing.T, sock, method, path string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctxTimeout(t), method, "http://"+SocketHost+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestHistoryEndpoints(t *testing.T) {
	b := &historyBackend{fakeBackend: fakeBackend{report: testReport()}}
	ts := startServer(t, "", ModePrivate, b)
	tests := []struct {
		method, path string
		status       int
		bodyHas      string
	}{
		{"GET", "/api/v1/history", 200, `"points":[[41,7]]`},
		{"GET", "/api/v1/history?since=40&events_after=3&wait=1", 200, `"now":42`},
		{"GET", "/api/v1/history?since=yesterday", 400, "not a time in unix seconds"},
		{"GET", "/api/v1/history?events_after=-1", 400, "not an event sequence number"},
		{"POST", "/api/v1/history", 405, "method POST is not allowed"},
		{"GET", "/api/v1/kernels/kernel-a/vars", 200, `"kind":"vars"`},
		{"GET", "/api/v1/kernels/kernel-a/vars?all_devices=1", 200, `"kind":"vars"`},
		{"GET", "/api/v1/kernels/kernel-zz/vars", 404, "kernel kernel-zz is not known to the daemon"},
		{"GET", "/api/v1/kernels/kernel-a/summary", 200, `"kind":"summary"`},
		{"POST", "/api/v1/kernels/kernel-a/vars", 405, "not allowed"},
	}
	for _, tc := range tests {
		status, body := rawGet(t, ts.path, tc.method, tc.path)
		if status != tc.status || !strings.Contains(body, tc.bodyHas) {
			t.Errorf("%s %s = %d %s, want %d containing %q", tc.method, tc.path, status, body, tc.status, tc.bodyHas)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	want := []HistoryQuery{{}, {Since: 40, EventsAfter: 3, Wait: true}}
	if fmt.Sprint(b.queries) != fmt.Sprint(want) {
		t.Errorf("backend got queries %+v, want %+v", b.queries, want)
	}
	if got := strings.Join(b.vars, "; "); got != "kernel-a /rt/kernel-kernel-a.json all=false; kernel-a /rt/kernel-kernel-a.json all=true" {
		t.Errorf("backend got vars calls %q", got)
	}
}

func TestHistoryWithoutBackendSupport(t *testing.T) {
	ts := startServer(t, "", ModePrivate, &fakeBackend{report: testReport()})
	for _, p := range []string{"/api/v1/history", "/api/v1/kernels/kernel-a/vars"} {
		if status, body := rawGet(t, ts.path, "GET", p); status != 404 {
			t.Errorf("GET %s = %d %s, want 404", p, status, body)
		}
	}
}

func TestUserHistory(t *testing.T) {
	rep := testReport()
	if len(rep.Notebooks) < 2 || rep.Notebooks[0].User == rep.Notebooks[1].User {
		t.Fatalf("testReport needs notebooks of two users: %+v", rep.Notebooks)
	}
	me, them := rep.Notebooks[0], rep.Notebooks[1]
	// Another user's kernel named after the caller's: told apart by its
	// connection file.
	twin := them
	twin.KernelID, twin.ConnectionFile = me.KernelID, "/home/them/kernel-"+me.KernelID+".json"
	rep.Notebooks = append(rep.Notebooks, twin)
	resp := HistoryResponse{
		Report: rep,
		Notebooks: []HistorySeries{{ID: me.KernelID, ConnectionFile: me.ConnectionFile}, {ID: them.KernelID, ConnectionFile: them.ConnectionFile},
			{ID: twin.KernelID, ConnectionFile: twin.ConnectionFile}},
		NotebookSM: []HistorySeries{{ID: them.KernelID, ConnectionFile: them.ConnectionFile}, {ID: twin.KernelID, ConnectionFile: twin.ConnectionFile},
			{ID: me.KernelID, ConnectionFile: me.ConnectionFile}},
		// Seq 4: a process left running of a kernel of the caller's that
		// is gone from the report (shut down): still theirs.
		Events: []history.Event{{Seq: 1, KernelID: them.KernelID, ConnectionFile: them.ConnectionFile},
			{Seq: 2, KernelID: me.KernelID, ConnectionFile: me.ConnectionFile}, {Seq: 3, KernelID: twin.KernelID, ConnectionFile: twin.ConnectionFile},
			{Seq: 4, KernelID: "gone", ConnectionFile: "/rt/kernel-gone.json", User: me.User, Kind: "left_running"},
			{Seq: 5, KernelID: "gone2", ConnectionFile: "/rt/kernel-gone2.json", User: them.User}},
	}
	got := userHistory(resp, me.User)
	for _, nb := range got.Report.Notebooks {
		if nb.User != me.User {
			t.Errorf("user %s sees notebook %s of %s", me.User, nb.KernelID, nb.User)
		}
	}
	if len(got.Notebooks) != 1 || got.Notebooks[0].ConnectionFile != me.ConnectionFile {
		t.Errorf("series = %+v, want only %s", got.Notebooks, me.KernelID)
	}
	if len(got.NotebookSM) != 1 || got.NotebookSM[0].ConnectionFile != me.ConnectionFile {
		t.Errorf("SM series = %+v, want only %s", got.NotebookSM, me.KernelID)
	}
	if len(got.Events) != 2 || got.Events[0].Seq != 2 || got.Events[1].Seq != 4 {
		t.Errorf("events = %+v, want seq 2 and 4", got.Events)
	}
	for _, u := range got.Users {
		if u.User == me.User {
			t.Errorf("the caller's own user is among the others: %+v", got.Users)
		}
	}
	if len(got.Users) == 0 {
		t.Errorf("no other user's total")
	}
	if strings.Contains(fmt.Sprint(got.Report), them.KernelID) {
		t.Errorf("another user's kernel id %s reached the caller", them.KernelID)
	}
}

// kernels= (a Jupyter server's own kernels): everyone else, per user, is
// in the reply; the kernels named are not.
func TestHistoryOthers(t *testing.T) {
	b := &historyBackend{fakeBackend: fakeBackend{report: testReport()}}
	ts := startServer(t, "", ModePrivate, b)
	status, body := rawGet(t, ts.path, "GET", "/api/v1/history?kernels=kernel-a,kernel-zz")
	if status != 200 {
		t.Fatalf("GET history = %d %s", status, body)
	}
	var resp HistoryResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	want := []UserUsage{
		{User: "bob", Notebooks: 1, OtherProcesses: 1, NotebookBytes: 15 << 30, OtherBytes: 5 << 30, GPUMemoryBytes: 20 << 30,
			PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 10 << 30}, {Index: 1, Bytes: 10 << 30}}},
		{User: "alice", Notebooks: 1, PerGPU: []attribution.GPUBytes{}},
	}
	if !reflect.DeepEqual(resp.Others, want) {
		t.Errorf("others\n%+v\nwant\n%+v", resp.Others, want)
	}
	if _, body := rawGet(t, ts.path, "GET", "/api/v1/history"); strings.Contains(body, `"others"`) {
		t.Errorf("others without kernels=: %s", body)
	}
}
