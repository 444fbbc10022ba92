package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/oom"
)

// oomBackend adds the out-of-memory interface to the fake.
type oomBackend struct {
	fakeBackend
	mu     sync.Mutex
	got    []string // kernel id: message, as recorded
	events []oom.Event
	err    error
}

var _ Backend = (*oomBackend)(nil)

func (b *oomBackend) RecordOOM(_ context.Context, k KernelRef, req oom.Request) (oom.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return oom.Event{}, b.err
	}
	b.got = append(b.got, k.ID+" "+k.ConnectionFile+": "+req.Message)
	ev := oom.Event{Seq: uint64(len(b.got)), KernelID: k.ID, ConnectionFile: k.ConnectionFile, User: "alice", Message: req.Message,
		Holders: []oom.HolderRow{{Holder: attribution.Holder{Kind: attribution.HolderNotebook, Name: "/home/bob/b.ipynb", User: "bob", Bytes: 1}}}}
	b.events = append(b.events, ev)
	return ev, nil
}

func (b *oomBackend) OOMEvents(context.Context) ([]oom.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]oom.Event(nil), b.events...), nil
}

// rawPost posts body with contentType ("" for none) over the socket.
func rawPost(t *testing.T, sock, path, contentType, body string) (int, string) {
	t.Helper()
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	r := rawDo(t, sock, http.MethodPost, path, SocketHost, h, body)
	return r.status, string(r.body)
}

func TestOOMEndpoints(t *testing.T) {
	b := &oomBackend{fakeBackend: fakeBackend{report: testReport()}}
	ts := startServerWith(t, "", ModePrivate, b, asAlice)
	const report = `{"framework":"torch","message":"CUDA out of memory.\u001b[2J","requested_bytes":1}`

	// This process is in no kernel: it may not report.
	if st, body := rawPost(t, ts.path, "/api/v1/oom", "application/json", report); st != 403 ||
		!strings.Contains(body, "is not a process of a kernel the daemon follows") {
		t.Errorf("a report from no kernel: %d %s", st, body)
	}
	// As kernel-a's process: recorded as kernel-a's, its text cleaned,
	// whatever kernel the body names.
	b.setKernel(os.Getpid(), fakeKernel{id: "kernel-a", owner: uint32(os.Geteuid())})
	st, body := rawPost(t, ts.path, "/api/v1/oom", "application/json",
		`{"framework":"torch","kernel_id":"kernel-b","message":"CUDA out of memory.\u001b[2J","requested_bytes":1}`)
	if st != 200 || !strings.Contains(body, `"kernel_id":"kernel-a"`) {
		t.Fatalf("report: %d %s", st, body)
	}
	b.mu.Lock()
	got := append([]string(nil), b.got...)
	b.mu.Unlock()
	// The kernel is the one of the caller's pid, by its connection file;
	// the escape is shown, not obeyed (textsafe).
	if want := "kernel-a " + connFileOf("kernel-a") + `: CUDA out of memory.\x1b[2J`; len(got) != 1 || got[0] != want {
		t.Errorf("recorded %q, want %q", got, want)
	}
	// The daemon's user sees the event whole.
	if !strings.Contains(body, "/home/bob/b.ipynb") || strings.Contains(body, `"view":"own"`) {
		t.Errorf("an admin's view: %s", body)
	}
	// A kernel's process whose kernel the last sample does not have yet.
	b.setKernel(os.Getpid(), fakeKernel{id: "kernel-zz", owner: uint32(os.Geteuid())})
	if st, body := rawPost(t, ts.path, "/api/v1/oom", "application/json", report); st != 404 || !strings.Contains(body, "not in the daemon's last sample") {
		t.Errorf("a report before its kernel is sampled: %d %s", st, body)
	}
	b.setKernel(os.Getpid(), fakeKernel{id: "kernel-a", owner: uint32(os.Geteuid())})
	big := fmt.Sprintf(`{"framework":"torch","message":%q}`, strings.Repeat("x", oom.MaxRequestBody))
	for _, c := range []struct {
		name, ctype, body string
		status            int
		has               string
	}{
		{"no JSON content type", "text/plain", report, 415, "Content-Type application/json"},
		{"no content type", "", report, 415, "Content-Type application/json"},
		{"too big", "application/json", big, 413, "over 65536 bytes"},
		{"unknown framework", "application/json", `{"framework":"numpy"}`, 400, "unknown framework"},
		{"not JSON", "application/json", `{"framework":`, 400, "body: unexpected EOF"},
		{"empty", "application/json", "", 400, "body is empty"},
		{"trailing data", "application/json", report + report, 400, "trailing data"},
		{"negative line", "application/json", `{"framework":"jax","cell":{"line":-1}}`, 400, "negative"},
	} {
		if st, body := rawPost(t, ts.path, "/api/v1/oom", c.ctype, c.body); st != c.status || !strings.Contains(body, c.has) {
			t.Errorf("%s: %d %s, want %d with %q", c.name, st, body, c.status, c.has)
		}
	}
	b.mu.Lock()
	b.err = fmt.Errorf("kernel-a reported too often: %w", ErrTooMany)
	b.mu.Unlock()
	if st, body := rawPost(t, ts.path, "/api/v1/oom", "application/json", report); st != 429 {
		t.Errorf("a flood: %d %s", st, body)
	}
	st, body = rawGet(t, ts.path, "GET", "/api/v1/oom")
	var evs OOMEventsResponse
	if st != 200 || json.Unmarshal([]byte(body), &evs) != nil || len(evs.Events) != 1 {
		t.Errorf("GET /api/v1/oom: %d %s", st, body)
	}
	if st, _ := rawGet(t, ts.path, "DELETE", "/api/v1/oom"); st != 405 {
		t.Errorf("DELETE /api/v1/oom: %d", st)
	}
}

func TestOOMEndpointsWithoutBackend(t *testing.T) {
	b := &fakeBackend{report: testReport()}
	b.setKernel(os.Getpid(), fakeKernel{id: "kernel-a", owner: uint32(os.Geteuid())})
	ts := startServerWith(t, "", ModePrivate, b, asAlice)
	if st, body := rawPost(t, ts.path, "/api/v1/oom", "application/json", `{"framework":"torch"}`); st != 404 {
		t.Errorf("POST: %d %s", st, body)
	}
	if st, body := rawPost(t, ts.path, "/api/v1/snapshots", "application/json", `{"path":"/x","reason":"manual"}`); st != 404 {
		t.Errorf("POST snapshots: %d %s", st, body)
	}
}

// asAlice names the test's own uid alice, the owner of kernel-a and
// kernel-c in testReport.
func asAlice(s *Server) { s.userName = func(uint32) string { return "alice" } }
