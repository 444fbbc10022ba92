package api

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// keepBackend keeps kernel-a; it refuses kernel-b as a daemon that culls
// nothing would.
type keepBackend struct{ whyBackend }

func (b *keepBackend) KeepKernel(_ context.Context, k KernelRef) (KeepReply, error) {
	b.record("keep " + k.ConnectionFile)
	if err := b.known(k); err != nil {
		return KeepReply{}, err
	}
	if k.ID == "kernel-b" {
		return KeepReply{}, fmt.Errorf("%w: this gpumem serve culls no kernel", ErrRefused)
	}
	return KeepReply{KernelID: k.ID, KeptAt: time.Unix(1700000000, 0).UTC(), Text: "Kept a.ipynb"}, nil
}

func TestKeepEndpoint(t *testing.T) {
	b := &keepBackend{whyBackend{fakeBackend: fakeBackend{report: testReport()}}}
	ts := startServer(t, "", ModePrivate, b)
	for _, tc := range []struct {
		method, path string
		status       int
		bodyHas      string
	}{
		{"POST", "/api/v1/kernels/kernel-a/keep", 200, `"text":"Kept a.ipynb"`},
		{"POST", "/api/v1/kernels/kernel-b/keep", 422, "culls no kernel"},
		{"POST", "/api/v1/kernels/kernel-zz/keep", 404, "kernel kernel-zz is not known to the daemon"},
		{"GET", "/api/v1/kernels/kernel-a/keep", 405, "use POST"},
	} {
		r := rawDo(t, ts.path, tc.method, tc.path, SocketHost, nil, "")
		if r.status != tc.status || !strings.Contains(string(r.body), tc.bodyHas) {
			t.Errorf("%s %s = %d %.200s, want %d containing %q", tc.method, tc.path, r.status, r.body, tc.status, tc.bodyHas)
		}
	}
	if got, want := b.got(), "keep "+connFileOf("kernel-a")+"; keep "+connFileOf("kernel-b"); got != want {
		t.Errorf("backend calls:\n got %s\nwant %s", got, want)
	}
	reply, err := NewClient(ts.path).Keep(context.Background(), "kernel-a")
	if err != nil || reply.KernelID != "kernel-a" || !reply.KeptAt.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("the client's keep: %+v, %v", reply, err)
	}
}

// In shared mode a user keeps only their own kernel: another user's is
// refused before the backend runs.
func TestKeepSharedModeSecondUID(t *testing.T) {
	dir, runAs := otherUser(t)
	b := &keepBackend{whyBackend{fakeBackend: fakeBackend{report: testReport()}}}
	ts := startServerWith(t, dir, ModeShared, b, func(s *Server) {
		s.userName = func(uid uint32) string {
			if uid == otherUID {
				return "alice"
			}
			return lookupUserName(uid)
		}
	})
	got := runAs(ts.path, nil, "POST /api/v1/kernels/kernel-a/keep", "POST /api/v1/kernels/kernel-b/keep")
	checkResults(t, got, map[string]string{"POST /api/v1/kernels/kernel-a/keep": "200", "POST /api/v1/kernels/kernel-b/keep": "403"})
	if calls := b.got(); calls != "keep "+connFileOf("kernel-a") {
		t.Errorf("backend calls for alice: %s", calls)
	}
}
