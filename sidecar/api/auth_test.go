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
	names := map[uint32]string{2000: "alice", 3000: "bob", 4000: "carol"}
	userName := func(uid uint32) string { return names[uid] }
	owners := map[string]string{"A": "alice", "B": "bob"}
	type call struct {
		a      access
		pathID string
	}
	var (
		healthz   = call{accessAnyone, ""}
		gpus      = call{accessUser, ""}
		notebooks = call{accessUser, ""} // filtered to the caller's own
		kernelA   = call{accessOwnKernel, "A"}
		kernelB   = call{accessOwnKernel, "B"}
		everyone  = []call{healthz, gpus, notebooks, kernelA, kernelB}
	)
	for _, tc := range []struct {
		name  string
		mode  Mode
		peer  Peer
		allow []call
		deny  []call
	}{
		{"private root", ModePrivate, Peer{PID: 1, UID: 0}, everyone, nil},
		{"private daemon user", ModePrivate, Peer{PID: 2, UID: daemonUID}, everyone, nil},
		{"private kernel of another user", ModePrivate, Peer{PID: 500, UID: 2000}, nil, everyone},
		{"private stranger", ModePrivate, Peer{PID: 7, UID: 4000}, nil, everyone},
		{"shared root", ModeShared, Peer{PID: 1, UID: 0}, everyone, nil},
		{"shared daemon user", ModeShared, Peer{PID: 2, UID: daemonUID}, everyone, nil},
		{"shared kernel A", ModeShared, Peer{PID: 500, UID: 2000}, []call{healthz, gpus, notebooks, kernelA}, []call{kernelB}},
		{"shared kernel B", ModeShared, Peer{PID: 600, UID: 3000}, []call{healthz, gpus, notebooks, kernelB}, []call{kernelA}},
		{"shared alice's shell", ModeShared, Peer{PID: 7, UID: 2000}, []call{healthz, gpus, notebooks, kernelA}, []call{kernelB}},
		{"shared pid of A, other uid", ModeShared, Peer{PID: 500, UID: 4000}, []call{healthz, gpus, notebooks}, []call{kernelA, kernelB}},
		{"shared user with no kernel", ModeShared, Peer{PID: 7, UID: 4000}, []call{healthz, gpus, notebooks}, []call{kernelA, kernelB}},
		{"shared pid unknown (other namespace)", ModeShared, Peer{PID: 0, UID: 2000}, []call{healthz, kernelA}, []call{kernelB}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := identify(tc.mode, daemonUID, tc.peer, userName)
			for _, cl := range tc.allow {
				if err := authorize(context.Background(), tc.mode, c, cl.a, cl.pathID, owners[cl.pathID], lookup); err != nil {
					t.Errorf("access %d to %q denied: %v", cl.a, cl.pathID, err)
				}
			}
			for _, cl := range tc.deny {
				if err := authorize(context.Background(), tc.mode, c, cl.a, cl.pathID, owners[cl.pathID], lookup); err == nil {
					t.Errorf("access %d to %q allowed", cl.a, cl.pathID)
				}
			}
		})
	}
}

// A user's view holds their own notebooks and processes only, and no
// warnings (they name other users' files).
func TestOwnView(t *testing.T) {
	rep := testReport()
	rep.Warnings = []string{"kernel connection file /home/bob/x.json: not counted as a kernel"}
	v := ownView(rep, "alice")
	if len(v.Notebooks) != 2 || v.Notebooks[0].User != "alice" || v.Notebooks[1].User != "alice" {
		t.Errorf("alice's notebooks: %+v", v.Notebooks)
	}
	if len(v.Other) != 0 || len(v.Warnings) != 0 || len(v.GPUs) != 2 {
		t.Errorf("alice's view: other %+v, warnings %q, %d GPUs", v.Other, v.Warnings, len(v.GPUs))
	}
	if b := ownView(rep, "bob"); len(b.Notebooks) != 1 || len(b.Other) != 1 {
		t.Errorf("bob's view: %+v", b)
	}
	if n := ownView(rep, "nobody"); len(n.Notebooks) != 0 || n.Notebooks == nil {
		t.Errorf("a user with nothing gets an empty list, not null: %+v", n.Notebooks)
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
// SO_PEERCRED, in shared mode: named alice, it sees and acts on alice's
// kernels only, whether it is one of her kernels' processes or her shell.
func TestSharedModeSecondUID(t *testing.T) {
	dir, runAs := otherUser(t)
	b := &fakeBackend{report: testReport()}
	as := func(name string) func(*Server) {
		return func(s *Server) {
			s.userName = func(uid uint32) string {
				if uid == otherUID {
					return name
				}
				return lookupUserName(uid)
			}
		}
	}
	ts := startServerWith(t, dir, ModeShared, b, as("alice"))
	alices := map[string]string{
		reqHealthz: "200", reqGPUs: "200", reqUsers: "200", reqNotebooks: "200", reqKernels: "200",
		reqKernelA: "200", reqFreeA: "200", reqKernelB: "403", reqFreeB: "403",
	}
	t.Run("process of alice's kernel A", func(t *testing.T) {
		got := runAs(ts.path, func(pid int) { b.setKernel(pid, fakeKernel{id: "kernel-a", owner: otherUID}) }, allRequests...)
		checkResults(t, got, alices)
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
	t.Run("alice's shell", func(t *testing.T) {
		got := runAs(ts.path, nil, allRequests...)
		checkResults(t, got, alices)
	})
	t.Run("a user with no kernel", func(t *testing.T) {
		sub := filepath.Join(dir, "carol")
		if err := os.Mkdir(sub, 0o711); err != nil {
			t.Fatal(err)
		}
		other := startServerWith(t, sub, ModeShared, b, as("carol"))
		got := runAs(other.path, func(pid int) { b.setKernel(pid, fakeKernel{id: "kernel-a", owner: 1234}) }, allRequests...)
		checkResults(t, got, map[string]string{
			reqHealthz: "200", reqGPUs: "200", reqUsers: "200", reqNotebooks: "200", reqKernels: "200",
			reqKernelA: "403", reqFreeA: "403", reqKernelB: "403", reqFreeB: "403",
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
