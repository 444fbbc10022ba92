package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// The rules as a pure table: mode × caller × endpoint, then which kernel
// an id names for that caller.
func TestAuthorizeTable(t *testing.T) {
	const daemonUID = 1000
	names := map[uint32]string{2000: "alice", 3000: "bob", 4000: "carol"}
	userName := func(uid uint32) string { return names[uid] }
	notebooks := []attribution.Notebook{
		{KernelID: "A", ConnectionFile: "/home/alice/rt/kernel-A.json", User: "alice"},
		{KernelID: "B", ConnectionFile: "/home/bob/rt/kernel-B.json", User: "bob"},
	}
	type call struct {
		a      access
		pathID string
	}
	var (
		healthz  = call{accessAnyone, ""}
		gpus     = call{accessUser, ""}
		listing  = call{accessUser, ""} // filtered to the caller's own
		kernelA  = call{accessOwnKernel, "A"}
		kernelB  = call{accessOwnKernel, "B"}
		everyone = []call{healthz, gpus, listing, kernelA, kernelB}
	)
	allowed := func(mode Mode, c caller, cl call) error {
		if err := authorize(mode, c, cl.a); err != nil {
			return err
		}
		if cl.a != accessOwnKernel {
			return nil
		}
		if _, status, msg := pickKernel(c, cl.pathID, "", notebooks); status != 0 {
			return fmt.Errorf("%d %s", status, msg)
		}
		return nil
	}
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
		{"shared alice", ModeShared, Peer{PID: 500, UID: 2000}, []call{healthz, gpus, listing, kernelA}, []call{kernelB}},
		{"shared bob", ModeShared, Peer{PID: 600, UID: 3000}, []call{healthz, gpus, listing, kernelB}, []call{kernelA}},
		{"shared user with no kernel", ModeShared, Peer{PID: 7, UID: 4000}, []call{healthz, gpus, listing}, []call{kernelA, kernelB}},
		{"shared pid unknown (other namespace)", ModeShared, Peer{PID: 0, UID: 2000}, []call{healthz, kernelA}, []call{kernelB}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := identify(tc.mode, daemonUID, tc.peer, userName)
			for _, cl := range tc.allow {
				if err := allowed(tc.mode, c, cl); err != nil {
					t.Errorf("access %d to %q denied: %v", cl.a, cl.pathID, err)
				}
			}
			for _, cl := range tc.deny {
				if err := allowed(tc.mode, c, cl); err == nil {
					t.Errorf("access %d to %q allowed", cl.a, cl.pathID)
				}
			}
		})
	}
}

// TestPickKernel: an id is no identity. Bob names his kernel's file after
// alice's kernel id: each of them gets their own kernel by that id, never
// the other's, and an admin is asked to say which. A refusal tells a user
// nothing about another user's kernels.
func TestPickKernel(t *testing.T) {
	const aliceX, bobX = "/home/alice/rt/kernel-X.json", "/home/bob/d/kernel-X.json"
	notebooks := []attribution.Notebook{
		{KernelID: "X", ConnectionFile: bobX, User: "bob", Notebook: "/home/bob/trap.ipynb"},
		{KernelID: "X", ConnectionFile: aliceX, User: "alice", Notebook: "/home/alice/secret.ipynb"},
		{KernelID: "Y", ConnectionFile: "/home/alice/rt/kernel-Y.json", User: "alice"},
		{KernelID: "Y", ConnectionFile: "/home/alice/other/kernel-Y.json", User: "alice"},
		{KernelID: "Z", ConnectionFile: "/rt/kernel-Z.json", User: ""}, // no proven process
	}
	alice := caller{role: roleUser, user: "alice", peer: Peer{UID: 2000}}
	bob := caller{role: roleUser, user: "bob", peer: Peer{UID: 3000}}
	admin := caller{role: roleAdmin, peer: Peer{UID: 0}}
	for _, tc := range []struct {
		name     string
		c        caller
		id, file string
		want     string // the connection file chosen, or ""
		status   int
		has      []string
		hasNot   []string
	}{
		{"alice's X", alice, "X", "", aliceX, 0, nil, nil},
		{"bob's X", bob, "X", "", bobX, 0, nil, nil},
		{"bob names alice's file", bob, "X", aliceX, "", http.StatusForbidden, []string{"not user bob's"}, []string{aliceX, "secret"}},
		{"bob asks alice's Y", bob, "Y", "", "", http.StatusForbidden, []string{"not user bob's"}, []string{"alice"}},
		{"bob asks an unknown id", bob, "nope", "", "", http.StatusForbidden, []string{"not user bob's"}, nil},
		{"alice's two Y", alice, "Y", "", "", http.StatusConflict, []string{"names 2 kernels", "/home/alice/rt/kernel-Y.json", "/home/alice/other/kernel-Y.json", "?connection_file="}, nil},
		{"alice names one Y", alice, "Y", "/home/alice/other/kernel-Y.json", "/home/alice/other/kernel-Y.json", 0, nil, nil},
		{"admin's X is ambiguous", admin, "X", "", "", http.StatusConflict, []string{aliceX, bobX, "user alice", "user bob"}, nil},
		{"admin names bob's X", admin, "X", bobX, bobX, 0, nil, nil},
		{"admin, unknown", admin, "nope", "", "", http.StatusNotFound, []string{"not known to the daemon"}, nil},
		{"admin, unknown file", admin, "X", "/nowhere/kernel-X.json", "", http.StatusNotFound, []string{"/nowhere/kernel-X.json"}, nil},
		{"unproven kernel: admins only", alice, "Z", "", "", http.StatusForbidden, nil, nil},
		{"unproven kernel, admin", admin, "Z", "", "/rt/kernel-Z.json", 0, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref, status, msg := pickKernel(tc.c, tc.id, tc.file, notebooks)
			if status != tc.status || ref.ConnectionFile != tc.want {
				t.Fatalf("pickKernel = %q, %d %q; want %q, %d", ref.ConnectionFile, status, msg, tc.want, tc.status)
			}
			if status == 0 && (ref.ID != tc.id || ref.Notebook.ConnectionFile != tc.want) {
				t.Errorf("ref = %+v, want id %s and its notebook", ref, tc.id)
			}
			for _, h := range tc.has {
				if !strings.Contains(msg, h) {
					t.Errorf("message %q lacks %q", msg, h)
				}
			}
			for _, h := range tc.hasNot {
				if strings.Contains(msg, h) {
					t.Errorf("message %q tells %q", msg, h)
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
	t.Run("bob's kernel named after alice's", func(t *testing.T) {
		// Bob's file kernel-kernel-a.json in his own dir: an id is public.
		// Bob acts on his kernel of that id, never on alice's.
		twin := &fakeBackend{report: testReport()}
		bobs := attribution.Notebook{KernelID: "kernel-a", ConnectionFile: "/home/bob/d/kernel-kernel-a.json", User: "bob"}
		twin.report.Notebooks = append([]attribution.Notebook{bobs}, twin.report.Notebooks...)
		sub := filepath.Join(dir, "bob")
		if err := os.Mkdir(sub, 0o711); err != nil {
			t.Fatal(err)
		}
		ts := startServerWith(t, sub, ModeShared, twin, as("bob"))
		got := runAs(ts.path, nil, reqKernelA, reqFreeA, reqFreeA, reqFreeA)
		checkResults(t, got, map[string]string{reqKernelA: "200", reqFreeA: "200"})
		calls := twin.freeCalls()
		if len(calls) != 3 {
			t.Fatalf("free calls %+v, want 3", calls)
		}
		for _, c := range calls {
			if c.connectionFile != bobs.ConnectionFile {
				t.Errorf("bob's free went to %s, want his own %s", c.connectionFile, bobs.ConnectionFile)
			}
		}
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
