package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

func TestEndpoints(t *testing.T) {
	b := &fakeBackend{report: testReport()}
	ts := startServer(t, "", ModePrivate, b)
	c := newTestClient(t, ts.path)
	ctx := ctxTimeout(t)

	if err := c.Healthz(ctx); err != nil {
		t.Errorf("Healthz: %v", err)
	}
	gpus, err := c.GPUs(ctx)
	if err != nil || !reflect.DeepEqual(gpus, testReport().GPUs) {
		t.Errorf("GPUs = %+v, %v; want %+v", gpus, err, testReport().GPUs)
	}
	rep, err := c.Notebooks(ctx)
	if err != nil || !reflect.DeepEqual(rep, testReport()) {
		t.Errorf("Notebooks = %+v, %v; want %+v", rep, err, testReport())
	}
	nb, err := c.Kernel(ctx, "kernel-b")
	if err != nil || !reflect.DeepEqual(nb, testReport().Notebooks[1]) {
		t.Errorf("Kernel(kernel-b) = %+v, %v", nb, err)
	}
	_, err = c.Kernel(ctx, "kernel-zz")
	wantStatus(t, err, http.StatusNotFound)
	users, err := c.Users(ctx)
	if err != nil || !reflect.DeepEqual(users, attribution.SummarizeUsers(testReport())) {
		t.Errorf("Users = %+v, %v", users, err)
	}

	reply, err := c.Free(ctx, "kernel-a", FreeRequest{})
	if err != nil || string(reply) != `{"freed_bytes":1024}` {
		t.Errorf("Free(kernel-a) = %s, %v", reply, err)
	}
	if _, err := c.Free(ctx, "kernel-a", FreeRequest{Vars: []string{"model", "x_1"}}); err != nil {
		t.Errorf("Free(kernel-a, vars): %v", err)
	}
	_, err = c.Free(ctx, "kernel-zz", FreeRequest{})
	wantStatus(t, err, http.StatusNotFound)

	// An unknown id is refused before the backend is asked.
	calls := b.freeCalls()
	if len(calls) != 2 {
		t.Fatalf("backend got %d free calls, want 2: %+v", len(calls), calls)
	}
	if calls[0].kernelID != "kernel-a" || calls[0].connectionFile != connFileOf("kernel-a") || !reflect.DeepEqual(calls[0].req, FreeRequest{}) {
		t.Errorf("first free call %+v, want kernel-a cache-only", calls[0])
	}
	if !reflect.DeepEqual(calls[1].req.Vars, []string{"model", "x_1"}) {
		t.Errorf("second free call %+v, want vars model, x_1", calls[1])
	}
	if calls[0].peer.PID != os.Getpid() || calls[0].peer.UID != uint32(os.Geteuid()) {
		t.Errorf("backend saw peer %+v, want pid %d uid %d", calls[0].peer, os.Getpid(), os.Geteuid())
	}
}

// GET /api/v1/notebooks is byte for byte the JSON of the report (what
// `gpumem ls --json` prints).
func TestNotebooksSameJSONAsReport(t *testing.T) {
	ts := startServer(t, "", ModePrivate, &fakeBackend{report: testReport()})
	r := rawDo(t, ts.path, "GET", "/api/v1/notebooks", SocketHost, nil, "")
	want, err := json.Marshal(testReport())
	if err != nil {
		t.Fatal(err)
	}
	if r.status != 200 || strings.TrimSpace(string(r.body)) != string(want) {
		t.Fatalf("GET /api/v1/notebooks = %d %s\nwant %s", r.status, r.body, want)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
}

func TestEmptyReportGPUsIsArray(t *testing.T) {
	ts := startServer(t, "", ModePrivate, &fakeBackend{})
	r := rawDo(t, ts.path, "GET", "/api/v1/gpus", "", nil, "")
	if r.status != 200 || strings.TrimSpace(string(r.body)) != `{"gpus":[]}` {
		t.Fatalf("GET /api/v1/gpus on an empty report = %d %s", r.status, r.body)
	}
}

func TestReportError(t *testing.T) {
	ts := startServer(t, "", ModePrivate, &fakeBackend{reportErr: errors.New("first sample not taken yet")})
	r := rawDo(t, ts.path, "GET", "/api/v1/notebooks", SocketHost, nil, "")
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.errorMessage(t), "first sample not taken yet") {
		t.Fatalf("GET /api/v1/notebooks with no snapshot = %d %s", r.status, r.body)
	}
}

// Anything a browser (through some local proxy) could send is refused.
func TestBrowserRequestsRefused(t *testing.T) {
	ts := startServer(t, "", ModePrivate, &fakeBackend{report: testReport()})
	for _, tc := range []struct {
		name   string
		host   string
		header http.Header
		want   int
	}{
		{"pseudo host", SocketHost, nil, 200},
		{"localhost", "localhost", nil, 200},
		{"empty host", "", nil, 200},
		{"origin", SocketHost, http.Header{"Origin": {"http://evil.example"}}, 403},
		{"empty origin", SocketHost, http.Header{"Origin": {""}}, 403},
		{"null origin", "localhost", http.Header{"Origin": {"null"}}, 403},
		{"referer", SocketHost, http.Header{"Referer": {"http://localhost:8888/lab"}}, 403},
		{"sec-fetch-site", SocketHost, http.Header{"Sec-Fetch-Site": {"same-origin"}}, 403},
		{"foreign host", "evil.example", nil, 403},
		{"rebinding host", "evil.example:80", nil, 403},
		{"localhost with port", "localhost:8888", nil, 403},
		{"loopback ip", "127.0.0.1", nil, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, rq := range [][2]string{{"GET", "/healthz"}, {"GET", "/api/v1/notebooks"}, {"POST", "/api/v1/kernels/kernel-a/free"}} {
				r := rawDo(t, ts.path, rq[0], rq[1], tc.host, tc.header, "")
				if r.status != tc.want {
					t.Errorf("%s %s with Host %q and %v: %d %s, want %d", rq[0], rq[1], tc.host, tc.header, r.status, r.body, tc.want)
				}
				if tc.want == 403 {
					r.errorMessage(t)
				}
			}
		})
	}
}

func TestMethodRules(t *testing.T) {
	b := &fakeBackend{report: testReport()}
	ts := startServer(t, "", ModePrivate, b)
	for _, tc := range []struct {
		method, path string
		want         int
		allow        string
	}{
		{"POST", "/api/v1/gpus", 405, "GET, HEAD"},
		{"PUT", "/api/v1/notebooks", 405, "GET, HEAD"},
		{"DELETE", "/api/v1/kernels/kernel-a", 405, "GET, HEAD"},
		{"POST", "/api/v1/kernels/kernel-a", 405, "GET, HEAD"},
		{"GET", "/api/v1/kernels/kernel-a/free", 405, "POST"},
		{"HEAD", "/api/v1/kernels/kernel-a/free", 405, "POST"},
		{"PUT", "/api/v1/kernels/kernel-a/free", 405, "POST"},
		{"POST", "/healthz", 405, "GET, HEAD"},
		{"GET", "/api/v1/nope", 404, ""},
		{"GET", "/api/v1/gpus/", 404, ""},
		{"GET", "/", 404, ""},
		{"HEAD", "/api/v1/gpus", 200, ""},
		{"GET", "/api/v1/kernels/kernel-a", 200, ""},
	} {
		r := rawDo(t, ts.path, tc.method, tc.path, SocketHost, nil, "")
		if r.status != tc.want {
			t.Errorf("%s %s = %d %s, want %d", tc.method, tc.path, r.status, r.body, tc.want)
			continue
		}
		if got := r.header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
		if tc.want >= 400 && tc.method != "HEAD" {
			r.errorMessage(t)
		}
	}
	if calls := b.freeCalls(); len(calls) != 0 {
		t.Errorf("a non-POST request freed memory: %+v", calls)
	}
}

func TestFreeBody(t *testing.T) {
	b := &fakeBackend{report: testReport()}
	ts := startServer(t, "", ModePrivate, b)
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name   string
		header http.Header
		body   string
		want   int
		req    FreeRequest // when want is 200
	}{
		{"no body", nil, "", 200, FreeRequest{}},
		{"empty object", jsonCT, "{}", 200, FreeRequest{}},
		{"vars", jsonCT, `{"vars":["model","опт"]}`, 200, FreeRequest{Vars: []string{"model", "опт"}}},
		{"all", http.Header{"Content-Type": {"application/json; charset=utf-8"}}, `{"all":true}`, 200, FreeRequest{All: true}},
		{"text/plain", http.Header{"Content-Type": {"text/plain"}}, `{"all":true}`, 415, FreeRequest{}},
		{"no content type", nil, `{"all":true}`, 415, FreeRequest{}},
		{"bad json", jsonCT, `{"all":`, 400, FreeRequest{}},
		{"unknown field", jsonCT, `{"al":true}`, 400, FreeRequest{}},
		{"trailing data", jsonCT, `{} {}`, 400, FreeRequest{}},
		{"both", jsonCT, `{"all":true,"vars":["x"]}`, 400, FreeRequest{}},
		{"code as name", jsonCT, `{"vars":["x; import os"]}`, 400, FreeRequest{}},
		{"too big", jsonCT, `{"vars":["` + strings.Repeat("x", maxFreeBody) + `"]}`, 413, FreeRequest{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(b.freeCalls())
			r := rawDo(t, ts.path, "POST", "/api/v1/kernels/kernel-a/free", SocketHost, tc.header, tc.body)
			if r.status != tc.want {
				t.Fatalf("POST free %q = %d %s, want %d", tc.body, r.status, r.body, tc.want)
			}
			calls := b.freeCalls()[before:]
			if tc.want != 200 {
				r.errorMessage(t)
				if len(calls) != 0 {
					t.Fatalf("refused request reached the backend: %+v", calls)
				}
				return
			}
			if len(calls) != 1 || !reflect.DeepEqual(calls[0].req, tc.req) {
				t.Fatalf("backend got %+v, want one call with %+v", calls, tc.req)
			}
		})
	}
}

func TestFreeBackendErrors(t *testing.T) {
	b := &fakeBackend{report: testReport()}
	ts := startServer(t, "", ModePrivate, b)
	c := newTestClient(t, ts.path)
	for _, tc := range []struct {
		name  string
		reply json.RawMessage
		err   error
		want  int
	}{
		{"timeout", nil, context.DeadlineExceeded, http.StatusGatewayTimeout},
		{"failure", nil, errors.New("kernel kernel-a is dead"), http.StatusInternalServerError},
		{"invalid json", json.RawMessage(`{"freed`), nil, http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b.mu.Lock()
			b.freeFunc = func(context.Context, string, FreeRequest) (json.RawMessage, error) { return tc.reply, tc.err }
			b.mu.Unlock()
			_, err := c.Free(ctxTimeout(t), "kernel-a", FreeRequest{})
			wantStatus(t, err, tc.want)
		})
	}
}

// Secrets in a request (a token in the query, an Authorization header, a
// body) never reach the logs.
func TestNoSecretsInLogs(t *testing.T) {
	const secret = "s3cr3tToken0123456789" // a valid identifier: it reaches the backend as a var
	b := &fakeBackend{report: testReport()}
	ts := startServer(t, "", ModePrivate, b)
	h := http.Header{"Authorization": {"token " + secret}, "Content-Type": {"application/json"}, "X-Token": {secret}}
	rawDo(t, ts.path, "GET", "/api/v1/notebooks?token="+secret, SocketHost, h, "")
	rawDo(t, ts.path, "GET", "/api/v1/nope?token="+secret, SocketHost, h, "")
	rawDo(t, ts.path, "POST", "/api/v1/kernels/kernel-a/free?token="+secret, SocketHost, h, `{"vars":["`+secret+`x"]}`)
	rawDo(t, ts.path, "POST", "/api/v1/kernels/kernel-a/free?token="+secret, SocketHost, h, `{"vars":["a b `+secret+`"]}`)
	rawDo(t, ts.path, "GET", "/healthz?token="+secret, "evil.example", h, "")
	ts.stop()
	logs := ts.logs.String()
	if logs == "" {
		t.Fatal("no logs at all: the test proves nothing")
	}
	if strings.Contains(logs, secret) {
		t.Fatalf("a secret reached the logs:\n%s", logs)
	}
}

// Shutdown cancels a request in flight and still returns promptly.
func TestServeShutdownWithRequestInFlight(t *testing.T) {
	entered := make(chan struct{})
	b := &fakeBackend{report: testReport()}
	b.freeFunc = func(ctx context.Context, _ string, _ FreeRequest) (json.RawMessage, error) {
		close(entered)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	ts := startServer(t, "", ModePrivate, b)
	c := newTestClient(t, ts.path)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Free(ctxTimeout(t), "kernel-a", FreeRequest{})
		errc <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("free never reached the backend")
	}
	start := time.Now()
	ts.stop()
	if d := time.Since(start); d > shutdownTimeout {
		t.Errorf("shutdown took %v", d)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Error("Free interrupted by shutdown returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("client call did not return after shutdown")
	}
}

func TestClientNoDaemon(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.sock")
	err := newTestClient(t, missing).Healthz(ctxTimeout(t))
	if !errors.Is(err, ErrNoDaemon) || !strings.Contains(err.Error(), missing) {
		t.Errorf("Healthz on a missing socket: %v, want ErrNoDaemon naming %s", err, missing)
	}

	// A stale socket file: nobody listens.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := Listen(t.Context(), stale, ModePrivate)
	if err != nil {
		t.Fatal(err)
	}
	ln.ul.SetUnlinkOnClose(false)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := newTestClient(t, stale).Notebooks(ctxTimeout(t)); !errors.Is(err, ErrNoDaemon) {
		t.Errorf("Notebooks on a stale socket: %v, want ErrNoDaemon", err)
	}

	// A daemon that answers is not ErrNoDaemon, even when it refuses.
	ts := startServer(t, "", ModePrivate, &fakeBackend{report: testReport()})
	_, err = newTestClient(t, ts.path).Kernel(ctxTimeout(t), "nope")
	if errors.Is(err, ErrNoDaemon) {
		t.Errorf("404 from a live daemon matched ErrNoDaemon: %v", err)
	}
}

func TestClientRejectsBadFreeRequest(t *testing.T) {
	b := &fakeBackend{report: testReport()}
	ts := startServer(t, "", ModePrivate, b)
	if _, err := newTestClient(t, ts.path).Free(ctxTimeout(t), "kernel-a", FreeRequest{Vars: []string{"os.system('x')"}}); err == nil {
		t.Fatal("Free with a non-identifier var: no error")
	}
	if calls := b.freeCalls(); len(calls) != 0 {
		t.Fatalf("bad request sent: %+v", calls)
	}
}

func TestKernelIDEscaped(t *testing.T) {
	rep := testReport()
	rep.Notebooks[0].KernelID = "a/b c"
	ts := startServer(t, "", ModePrivate, &fakeBackend{report: rep})
	nb, err := newTestClient(t, ts.path).Kernel(ctxTimeout(t), "a/b c")
	if err != nil || nb.KernelID != "a/b c" {
		t.Fatalf("Kernel(%q) = %+v, %v", "a/b c", nb, err)
	}
}

var _ Backend = (*fakeBackend)(nil)

// SummarizeUsers is pure: table test.
func TestSummarizeUsers(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   attribution.Report
		want []UserUsage
	}{
		{"empty", attribution.Report{}, []UserUsage{}},
		{"two users", testReport(), []UserUsage{
			{User: "alice", Notebooks: 2, NotebookBytes: 20 << 30, GPUMemoryBytes: 20 << 30, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 20 << 30}}},
			{User: "bob", Notebooks: 1, OtherProcesses: 1, NotebookBytes: 15 << 30, OtherBytes: 5 << 30, GPUMemoryBytes: 20 << 30,
				PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 10 << 30}, {Index: 1, Bytes: 10 << 30}}},
		}},
		{"idle notebook", attribution.Report{Notebooks: []attribution.Notebook{{KernelID: "k", User: "carol"}}},
			[]UserUsage{{User: "carol", Notebooks: 1, PerGPU: []attribution.GPUBytes{}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := attribution.SummarizeUsers(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("SummarizeUsers =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestFreeRequestValidate(t *testing.T) {
	for _, tc := range []struct {
		req FreeRequest
		ok  bool
	}{
		{FreeRequest{}, true},
		{FreeRequest{All: true}, true},
		{FreeRequest{Vars: []string{"x", "_y", "Model2", "données"}}, true},
		{FreeRequest{Vars: []string{"x"}, All: true}, false},
		{FreeRequest{Vars: []string{""}}, false},
		{FreeRequest{Vars: []string{"2x"}}, false},
		{FreeRequest{Vars: []string{"a.b"}}, false},
		{FreeRequest{Vars: []string{"a[0]"}}, false},
		{FreeRequest{Vars: []string{"x\n"}}, false},
		{FreeRequest{Vars: []string{strings.Repeat("x", maxVarNameSize+1)}}, false},
		{FreeRequest{Vars: make([]string, maxFreeVars+1)}, false},
	} {
		if err := tc.req.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v.Validate() = %v, want ok=%v", tc.req, err, tc.ok)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"private", "shared"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseMode("public"); err == nil {
		t.Error("ParseMode(public): no error")
	}
}

// ?fresh=1 answers from a sample taken now, not from the last report.
func TestKernelFresh(t *testing.T) {
	b := &fakeBackend{report: testReport(), fresh: map[string]attribution.Notebook{
		"kernel-a": {KernelID: "kernel-a", GPUMemoryBytes: 12345}}}
	ts := startServer(t, "", ModePrivate, b)
	r := rawDo(t, ts.path, "GET", "/api/v1/kernels/kernel-a?fresh=1", SocketHost, nil, "")
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"gpu_memory_bytes":12345`) {
		t.Errorf("fresh: %d %s", r.status, r.body)
	}
	r = rawDo(t, ts.path, "GET", "/api/v1/kernels/nope?fresh=1", SocketHost, nil, "")
	if r.status != http.StatusNotFound {
		t.Errorf("fresh, unknown kernel: %d %s", r.status, r.body)
	}
}

// A free asked from inside the kernel it frees cannot run before the
// asking cell ends: it gets a short deadline and an error that says so,
// instead of waiting forever.
func TestFreeFromInsideItsKernel(t *testing.T) {
	b := &fakeBackend{report: testReport()}
	b.freeFunc = func(ctx context.Context, _ string, _ FreeRequest) (json.RawMessage, error) {
		<-ctx.Done() // the kernel never gets to it
		return nil, ctx.Err()
	}
	b.setKernel(os.Getpid(), fakeKernel{id: "kernel-a", owner: uint32(os.Getuid())})
	ts := startServerWith(t, "", ModePrivate, b, func(s *Server) { s.selfFreeWait = 200 * time.Millisecond })
	r := rawDo(t, ts.path, "POST", "/api/v1/kernels/kernel-a/free", SocketHost,
		http.Header{"Content-Type": {"application/json"}}, "")
	if r.status != http.StatusGatewayTimeout || !strings.Contains(string(r.body), "from inside this kernel") {
		t.Errorf("self free: %d %s", r.status, r.body)
	}
}
