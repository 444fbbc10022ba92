package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The rules as a pure table: mode × caller × endpoint.
func TestAuthorizeTable(t *testing.T) {
	const daemonUID = 1000
	kernels := map[int]fakeKernel{
		500: {id: "A", owner: 2000}, // a kernel process of uid 2000
		600: {id: "B", owner: 3000},
	}
	lookup := func(_ context.Context, pid int) (string, uint32, bool) {
		k, ok := kernels[pid]
		return k.id, k.owner, ok
	}
	type call struct {
		a      access
		pathID string
	}
	var (
		healthz   = call{accessAnyone, ""}
		gpus      = call{accessKernel, ""}
		notebooks = call{accessAdmin, ""}
		kernelA   = call{accessOwnKernel, "A"}
		kernelB   = call{accessOwnKernel, "B"}
	)
	for _, tc := range []struct {
		name  string
		mode  Mode
		peer  Peer
		allow []call
		deny  []call
	}{
		{"private root", ModePrivate, Peer{PID: 1, UID: 0}, []call{healthz, gpus, notebooks, kernelA, kernelB}, nil},
		{"private daemon user", ModePrivate, Peer{PID: 2, UID: daemonUID}, []call{healthz, gpus, notebooks, kernelA, kernelB}, nil},
		{"private kernel of another user", ModePrivate, Peer{PID: 500, UID: 2000}, nil, []call{healthz, gpus, notebooks, kernelA, kernelB}},
		{"private stranger", ModePrivate, Peer{PID: 7, UID: 4000}, nil, []call{healthz, gpus, notebooks, kernelA, kernelB}},
		{"shared root", ModeShared, Peer{PID: 1, UID: 0}, []call{healthz, gpus, notebooks, kernelA, kernelB}, nil},
		{"shared daemon user", ModeShared, Peer{PID: 2, UID: daemonUID}, []call{healthz, gpus, notebooks, kernelA, kernelB}, nil},
		{"shared kernel A", ModeShared, Peer{PID: 500, UID: 2000}, []call{healthz, gpus, kernelA}, []call{notebooks, kernelB}},
		{"shared kernel B", ModeShared, Peer{PID: 600, UID: 3000}, []call{healthz, gpus, kernelB}, []call{notebooks, kernelA}},
		{"shared pid of A, other uid", ModeShared, Peer{PID: 500, UID: 4000}, []call{healthz}, []call{gpus, notebooks, kernelA, kernelB}},
		{"shared stranger", ModeShared, Peer{PID: 7, UID: 4000}, []call{healthz}, []call{gpus, notebooks, kernelA, kernelB}},
		{"shared pid unknown (other namespace)", ModeShared, Peer{PID: 0, UID: 2000}, []call{healthz}, []call{gpus, notebooks, kernelA, kernelB}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := identify(context.Background(), tc.mode, daemonUID, tc.peer, lookup)
			for _, cl := range tc.allow {
				if err := authorize(tc.mode, c, cl.a, cl.pathID); err != nil {
					t.Errorf("access %d to %q denied: %v", cl.a, cl.pathID, err)
				}
			}
			for _, cl := range tc.deny {
				if err := authorize(tc.mode, c, cl.a, cl.pathID); err == nil {
					t.Errorf("access %d to %q allowed", cl.a, cl.pathID)
				}
			}
		})
	}
}

// Root (the test process) may do everything in shared mode.
func TestSharedModeRoot(t *testing.T) {
	requireRoot(t)
	b := &fakeBackend{report: testReport()}
	ts := startServer(t, "", ModeShared, b)
	c := newTestClient(t, ts.path)
	ctx := ctxTimeout(t)
	if _, err := c.Notebooks(ctx); err != nil {
		t.Errorf("root: Notebooks: %v", err)
	}
	if _, err := c.Kernel(ctx, "kernel-b"); err != nil {
		t.Errorf("root: Kernel(kernel-b): %v", err)
	}
	if _, err := c.Free(ctx, "kernel-b", FreeRequest{All: true}); err != nil {
		t.Errorf("root: Free(kernel-b): %v", err)
	}
}

var (
	reqHealthz   = "GET /healthz"
	reqGPUs      = "GET /api/v1/gpus"
	reqUsers     = "GET /api/v1/users"
	reqNotebooks = "GET /api/v1/notebooks"
	reqKernels   = "GET /api/v1/kernels"
	reqKernelA   = "GET /api/v1/kernels/kernel-a"
	reqKernelB   = "GET /api/v1/kernels/kernel-b"
	reqFreeA     = "POST /api/v1/kernels/kernel-a/free"
	reqFreeB     = "POST /api/v1/kernels/kernel-b/free"
	allRequests  = []string{reqHealthz, reqGPUs, reqUsers, reqNotebooks, reqKernels, reqKernelA, reqKernelB, reqFreeA, reqFreeB}
)

func checkResults(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	for rq, w := range want {
		if g := got[rq]; g != w && !(strings.HasPrefix(w, "error: ") && strings.Contains(g, strings.TrimPrefix(w, "error: "))) {
			t.Errorf("%s as uid %d: %q, want %q", rq, otherUID, g, w)
		}
	}
}

// A real process of a second uid, through a real socket, with real
// SO_PEERCRED, in shared mode.
func TestSharedModeSecondUID(t *testing.T) {
	dir, runAs := otherUser(t)
	b := &fakeBackend{report: testReport()}
	ts := startServer(t, dir, ModeShared, b)

	t.Run("process of kernel A", func(t *testing.T) {
		got := runAs(ts.path, func(pid int) { b.setKernel(pid, fakeKernel{id: "kernel-a", owner: otherUID}) }, allRequests...)
		checkResults(t, got, map[string]string{
			reqHealthz: "200", reqGPUs: "200", reqUsers: "200",
			reqKernelA: "200", reqFreeA: "200",
			reqNotebooks: "403", reqKernels: "403", reqKernelB: "403", reqFreeB: "403",
		})
		var freedA, freedB int
		for _, c := range b.freeCalls() {
			if c.peer.UID != otherUID {
				continue
			}
			switch c.kernelID {
			case "kernel-a":
				freedA++
			case "kernel-b":
				freedB++
			}
		}
		if freedA != 1 || freedB != 0 {
			t.Errorf("backend freed kernel-a %d times and kernel-b %d times for uid %d, want 1 and 0", freedA, freedB, otherUID)
		}
	})
	t.Run("not a kernel process", func(t *testing.T) {
		got := runAs(ts.path, nil, allRequests...)
		checkResults(t, got, map[string]string{
			reqHealthz: "200", reqGPUs: "403", reqUsers: "403", reqNotebooks: "403", reqKernels: "403",
			reqKernelA: "403", reqKernelB: "403", reqFreeA: "403", reqFreeB: "403",
		})
	})
	t.Run("pid of kernel A owned by another uid", func(t *testing.T) {
		got := runAs(ts.path, func(pid int) { b.setKernel(pid, fakeKernel{id: "kernel-a", owner: 1234}) }, allRequests...)
		checkResults(t, got, map[string]string{
			reqHealthz: "200", reqGPUs: "403", reqKernelA: "403", reqFreeA: "403",
		})
	})
	t.Run("the daemon's own uid", func(t *testing.T) {
		// A daemon running as uid otherUID: its user may do anything.
		sub := filepath.Join(dir, "own")
		if err := os.Mkdir(sub, 0o711); err != nil {
			t.Fatal(err)
		}
		own := startServerWith(t, sub, ModeShared, b, func(s *Server) { s.daemonUID = otherUID })
		got := runAs(own.path, nil, allRequests...)
		checkResults(t, got, map[string]string{
			reqHealthz: "200", reqGPUs: "200", reqUsers: "200", reqNotebooks: "200", reqKernels: "200",
			reqKernelA: "200", reqKernelB: "200", reqFreeA: "200", reqFreeB: "200",
		})
	})
}

// In private mode a second uid cannot even connect; and should the file mode
// be loosened by hand, the server still refuses it.
func TestPrivateModeSecondUID(t *testing.T) {
	dir, runAs := otherUser(t)
	b := &fakeBackend{report: testReport()}
	ts := startServer(t, dir, ModePrivate, b)

	got := runAs(ts.path, func(pid int) { b.setKernel(pid, fakeKernel{id: "kernel-a", owner: otherUID}) }, reqHealthz, reqKernelA)
	checkResults(t, got, map[string]string{reqHealthz: "error: permission denied", reqKernelA: "error: permission denied"})

	if err := os.Chmod(ts.path, 0o666); err != nil {
		t.Fatal(err)
	}
	got = runAs(ts.path, func(pid int) { b.setKernel(pid, fakeKernel{id: "kernel-a", owner: otherUID}) }, allRequests...)
	want := map[string]string{}
	for _, rq := range allRequests {
		want[rq] = "403"
	}
	checkResults(t, got, want)
	if calls := b.freeCalls(); len(calls) != 0 {
		t.Errorf("backend freed for a refused caller: %+v", calls)
	}
}

func TestNoPeerCredentials(t *testing.T) {
	srv := NewServer(&fakeBackend{report: testReport()}, Options{})
	rec := httptest.NewRecorder()
	srv.handler(ModePrivate).ServeHTTP(rec, httptest.NewRequest("GET", "http://"+SocketHost+"/healthz", nil))
	if rec.Code != http.StatusForbidden {
		t.Fatalf("request without peer credentials: %d %s", rec.Code, rec.Body.String())
	}
}
