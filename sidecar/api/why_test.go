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
)

// whyBackend adds the why and children interfaces, recording each call.
type whyBackend struct {
	fakeBackend
	mu    sync.Mutex
	calls []string
}

func (b *whyBackend) record(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, s)
}

func (b *whyBackend) got() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.calls, "; ")
}

var (
	_ Backend = (*whyBackend)(nil)
)

// known checks that the server handed over the connection file of the
// kernel it picked, as the daemon's lookups need.
func (b *whyBackend) known(k KernelRef) error {
	for _, nb := range b.report.Notebooks {
		if nb.ConnectionFile == k.ConnectionFile && nb.KernelID == k.ID && k.Notebook.ConnectionFile == k.ConnectionFile {
			return nil
		}
	}
	return fmt.Errorf("kernel %s: %w", k.ID, ErrKernelNotFound)
}

func (b *whyBackend) KernelWhy(_ context.Context, k KernelRef, q WhyQuery) (json.RawMessage, error) {
	dev := "-"
	if q.Device != nil {
		dev = fmt.Sprint(*q.Device)
	}
	b.record(fmt.Sprintf("why %s device=%s all=%v budget=%v", k.ConnectionFile, dev, q.AllDevices, q.Budget))
	if err := b.known(k); err != nil {
		return nil, err
	}
	return json.RawMessage(`{"kind":"why","text":"rows"}`), nil
}

func (b *whyBackend) JoinWhy(_ context.Context, k KernelRef, data json.RawMessage) (json.RawMessage, error) {
	b.record(fmt.Sprintf("join %s %s", k.ConnectionFile, data))
	if err := b.known(k); err != nil {
		return nil, err
	}
	if !strings.Contains(string(data), `"kind":"why"`) {
		return nil, fmt.Errorf("%w: not why data", ErrRefused)
	}
	return json.RawMessage(`{"kind":"why","driver":{}}`), nil
}

func (b *whyBackend) FreeChildren(_ context.Context, k KernelRef, fromKernel bool, _ FreeChildrenRequest) (json.RawMessage, error) {
	b.record(fmt.Sprintf("children %s from_kernel=%v", k.ConnectionFile, fromKernel))
	if err := b.known(k); err != nil {
		return nil, err
	}
	return json.RawMessage(`{"kind":"children","ended":[]}`), nil
}

func (b *whyBackend) ChildrenBefore(_ context.Context, k KernelRef) (json.RawMessage, error) {
	b.record("before " + k.ConnectionFile)
	if err := b.known(k); err != nil {
		return nil, err
	}
	return json.RawMessage(`{"before":1}`), nil
}

func TestWhyEndpoints(t *testing.T) {
	b := &whyBackend{fakeBackend: fakeBackend{report: testReport()}}
	ts := startServer(t, "", ModePrivate, b)
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	tests := []struct {
		method, path string
		header       http.Header
		body         string
		status       int
		bodyHas      string
	}{
		{"GET", "/api/v1/kernels/kernel-a/why", nil, "", 200, `"kind":"why"`},
		{"GET", "/api/v1/kernels/kernel-a/why?device=1&all_devices=1&budget=0.5", nil, "", 200, `"text":"rows"`},
		{"GET", "/api/v1/kernels/kernel-a/why?device=-1", nil, "", 400, "not a CUDA device number"},
		{"GET", "/api/v1/kernels/kernel-a/why?budget=9999", nil, "", 400, "between 0 and 600"},
		{"GET", "/api/v1/kernels/kernel-zz/why", nil, "", 404, "kernel kernel-zz is not known to the daemon"},
		{"POST", "/api/v1/kernels/kernel-a/why", jsonCT, `{"kind":"why","rows":[]}`, 200, `"driver"`},
		{"POST", "/api/v1/kernels/kernel-a/why", nil, `{"kind":"why"}`, 415, "application/json"},
		{"POST", "/api/v1/kernels/kernel-a/why", jsonCT, `{"kind":`, 400, "why data: body: unexpected EOF"},
		{"POST", "/api/v1/kernels/kernel-a/why", jsonCT, `{"kind":"vars"}`, 422, "not why data"},
		{"POST", "/api/v1/kernels/kernel-a/why", jsonCT, `"` + strings.Repeat("x", maxWhyBody) + `"`, 413, "over"},
		{"PUT", "/api/v1/kernels/kernel-a/why", nil, "", 405, "not allowed"},
		{"POST", "/api/v1/kernels/kernel-a/children/free", nil, "", 200, `"kind":"children"`},
		{"POST", "/api/v1/kernels/kernel-zz/children/free", nil, "", 404, "kernel kernel-zz is not known to the daemon"},
		{"POST", "/api/v1/kernels/kernel-zz/why", jsonCT, `{"kind":"why"}`, 404, "kernel kernel-zz is not known to the daemon"},
		{"GET", "/api/v1/kernels/kernel-a/children/free", nil, "", 405, "use POST"},
		// Only the kernel's own cell asks for the figures before its teardown.
		{"POST", "/api/v1/kernels/kernel-a/children/before", nil, "", 409, "only the kernel's own cell"},
	}
	for _, tc := range tests {
		r := rawDo(t, ts.path, tc.method, tc.path, SocketHost, tc.header, tc.body)
		if r.status != tc.status || !strings.Contains(string(r.body), tc.bodyHas) {
			t.Errorf("%s %s = %d %.200s, want %d containing %q", tc.method, tc.path, r.status, r.body, tc.status, tc.bodyHas)
		}
	}
	// An unknown kernel is refused by the server (pickKernel) before any
	// backend call; the backend gets the chosen kernel's connection file.
	a := connFileOf("kernel-a")
	want := "why " + a + " device=- all=false budget=0; why " + a + " device=1 all=true budget=0.5; " +
		"join " + a + " {\"kind\":\"why\",\"rows\":[]}; " +
		"join " + a + " {\"kind\":\"vars\"}; children " + a + " from_kernel=false"
	if got := b.got(); got != want {
		t.Errorf("backend calls:\n got %s\nwant %s", got, want)
	}
}

// A request from inside the kernel: free --children skips the teardown the
// kernel ran itself; a why query, which the kernel could only answer after
// the asking cell, is refused at once.
func TestWhyAndChildrenFromInsideTheKernel(t *testing.T) {
	b := &whyBackend{fakeBackend: fakeBackend{report: testReport()}}
	b.setKernel(os.Getpid(), fakeKernel{id: "kernel-a"})
	ts := startServer(t, "", ModePrivate, b)
	if r := rawDo(t, ts.path, "POST", "/api/v1/kernels/kernel-a/children/before", SocketHost, nil, ""); r.status != 200 {
		t.Fatalf("the figures before the teardown, from the kernel: %d %s", r.status, r.body)
	}
	if r := rawDo(t, ts.path, "POST", "/api/v1/kernels/kernel-a/children/free", SocketHost, nil, ""); r.status != 200 {
		t.Fatalf("children from the kernel: %d %s", r.status, r.body)
	}
	r := rawDo(t, ts.path, "GET", "/api/v1/kernels/kernel-a/why", SocketHost, nil, "")
	if r.status != 409 || !strings.Contains(r.errorMessage(t), "use %gpumem why in the notebook") {
		t.Errorf("why from the kernel: %d %s", r.status, r.body)
	}
	if got := b.got(); got != "before "+connFileOf("kernel-a")+"; children "+connFileOf("kernel-a")+" from_kernel=true" {
		t.Errorf("backend calls: %s", got)
	}
}

// A process of another kernel is not inside this one: its why query is
// answered and its free --children runs the teardown, whatever it names.
func TestWhyAndChildrenFromAnotherKernel(t *testing.T) {
	b := &whyBackend{fakeBackend: fakeBackend{report: testReport()}}
	b.setKernel(os.Getpid(), fakeKernel{id: "kernel-b"})
	ts := startServer(t, "", ModePrivate, b)
	if r := rawDo(t, ts.path, "POST", "/api/v1/kernels/kernel-a/children/free", SocketHost, nil, ""); r.status != 200 {
		t.Fatalf("children from another kernel: %d %s", r.status, r.body)
	}
	if r := rawDo(t, ts.path, "GET", "/api/v1/kernels/kernel-a/why", SocketHost, nil, ""); r.status != 200 {
		t.Errorf("why from another kernel: %d %s", r.status, r.body)
	}
	a := connFileOf("kernel-a")
	if got, want := b.got(), "children "+a+" from_kernel=false; why "+a+" device=- all=false budget=0"; got != want {
		t.Errorf("backend calls:\n got %s\nwant %s", got, want)
	}
}

// In shared mode a second user's process acts on their own kernel's
// workers only; another user's kernel is refused before the backend runs.
func TestChildrenSharedModeSecondUID(t *testing.T) {
	dir, runAs := otherUser(t)
	b := &whyBackend{fakeBackend: fakeBackend{report: testReport()}}
	ts := startServerWith(t, dir, ModeShared, b, func(s *Server) {
		s.userName = func(uid uint32) string {
			if uid == otherUID {
				return "alice"
			}
			return lookupUserName(uid)
		}
	})
	got := runAs(ts.path, nil, "POST /api/v1/kernels/kernel-a/children/free", "POST /api/v1/kernels/kernel-b/children/free",
		"GET /api/v1/kernels/kernel-b/why", "POST /api/v1/kernels/kernel-b/why")
	checkResults(t, got, map[string]string{
		"POST /api/v1/kernels/kernel-a/children/free": "200", "POST /api/v1/kernels/kernel-b/children/free": "403",
		"GET /api/v1/kernels/kernel-b/why": "403", "POST /api/v1/kernels/kernel-b/why": "403",
	})
	if calls := b.got(); calls != "children "+connFileOf("kernel-a")+" from_kernel=false" {
		t.Errorf("backend calls for alice: %s", calls)
	}
}
