package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// orphanBackend also ends processes left running; it records what it was
// asked and knows kernel-z's (a kernel shut down since: only the report's
// LeftRunning names its user).
type orphanBackend struct {
	*fakeBackend
	mu   sync.Mutex
	asks []EndOrphansRequest
	who  []string // connection file and user of each ask
}

var _ Backend = (*orphanBackend)(nil)

func (b *orphanBackend) EndOrphans(_ context.Context, k KernelRef, user string, req EndOrphansRequest) (EndOrphansReply, error) {
	b.mu.Lock()
	b.asks = append(b.asks, req)
	b.who = append(b.who, k.ConnectionFile+" "+user)
	b.mu.Unlock()
	if k.ConnectionFile != connFileOf("kernel-z") {
		return EndOrphansReply{}, fmt.Errorf("kernel %s: none left running: %w", k.ID, ErrKernelNotFound)
	}
	return EndOrphansReply{KernelID: k.ID, Processes: []EndedProcess{{PID: 4242, Ended: true, Bytes: 20 << 30}}}, nil
}

// orphanReport has alice's kernel-z, shut down since, with a process left
// running: only the report's LeftRunning names it (and its user).
func orphanReport() attribution.Report {
	rep := testReport()
	rep.LeftRunning = []attribution.LeftRunning{{KernelID: "kernel-z", ConnectionFile: connFileOf("kernel-z"), Notebook: "/home/alice/train.ipynb", User: "alice", PID: 4242,
		Command: "python train.py", GPUs: []int{0}, Bytes: 20 << 30, Reason: attribution.ComputeComputing, Message: "a job…"}}
	return rep
}

const reqEndZ = "POST /api/v1/kernels/kernel-z/orphans/end"

func TestEndOrphansEndpoint(t *testing.T) {
	b := &orphanBackend{fakeBackend: &fakeBackend{report: orphanReport()}}
	ts := startServer(t, "", ModePrivate, b)
	c := newTestClient(t, ts.path)
	reply, err := c.EndOrphans(ctxTimeout(t), "kernel-z", EndOrphansRequest{PIDs: []int{4242}})
	if err != nil || len(reply.Processes) != 1 || !reply.Processes[0].Ended {
		t.Fatalf("EndOrphans: %+v, %v", reply, err)
	}
	if _, err := c.EndOrphans(ctxTimeout(t), "kernel-a", EndOrphansRequest{}); !is404(err) {
		t.Errorf("a kernel with nothing left running: %v, want 404", err)
	}
	if _, err := c.EndOrphans(ctxTimeout(t), "kernel-z", EndOrphansRequest{PIDs: []int{-1}}); err == nil {
		t.Error("a negative pid was sent")
	}
	json := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name   string
		header http.Header
		body   string
		status int
	}{
		{"no body: all of the kernel's", nil, "", 200},
		{"pid 0", json, `{"pids":[0]}`, 400},
		{"unknown field", json, `{"pid":4242}`, 400},
		{"a body without its content type", nil, `{"pids":[4242]}`, 415},
		{"GET", nil, "", 405},
	} {
		method := http.MethodPost
		if tc.name == "GET" {
			method = http.MethodGet
		}
		if r := rawDo(t, ts.path, method, "/api/v1/kernels/kernel-z/orphans/end", SocketHost, tc.header, tc.body); r.status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, r.status, r.body, tc.status)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.asks) != 3 || !slices.Equal(b.asks[0].PIDs, []int{4242}) || b.asks[2].PIDs != nil {
		t.Errorf("backend asked %+v", b.asks)
	}
	if !strings.Contains(ts.logs.String(), "processes left running: end asked") {
		t.Errorf("no log of the request:\n%s", ts.logs.String())
	}
}

// Only the notebook's user (or an admin) may end what was left running of
// it, also once its kernel is gone from the report: the owner is then the
// one LeftRunning names, and the kernel its connection file. Bob naming
// his own kernel after alice's dead one reaches his kernel only, and the
// daemon ends only what it recorded as his.
func TestEndOrphansOnlyTheirUser(t *testing.T) {
	dir, runAs := otherUser(t)
	bobsTwin := attribution.Notebook{KernelID: "kernel-z", ConnectionFile: "/home/bob/rt/kernel-kernel-z.json", User: "bob"}
	for _, tc := range []struct {
		name, user, want, asked string
		twin                    bool
	}{
		{"alice", "alice", "200", connFileOf("kernel-z") + " alice", false},
		{"bob", "bob", "403", "", false},
		{"bob's twin", "bob", "404", bobsTwin.ConnectionFile + " bob", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.Mkdir(sub, 0o711); err != nil {
				t.Fatal(err)
			}
			rep := orphanReport()
			if tc.twin {
				rep.Notebooks = append(rep.Notebooks, bobsTwin)
			}
			b := &orphanBackend{fakeBackend: &fakeBackend{report: rep}}
			ts := startServerWith(t, sub, ModeShared, b, func(s *Server) {
				s.userName = func(uid uint32) string {
					if uid == otherUID {
						return tc.user
					}
					return lookupUserName(uid)
				}
			})
			got := runAs(ts.path, nil, reqEndZ)
			checkResults(t, got, map[string]string{reqEndZ: tc.want})
			b.mu.Lock()
			defer b.mu.Unlock()
			if asked := strings.Join(b.who, "; "); asked != tc.asked {
				t.Errorf("backend asked for %q, want %q", asked, tc.asked)
			}
		})
	}
}

// The reply the user sees excludes other users' processes left running
// and hoarding.
func TestOwnViewLeftRunningAndHoarding(t *testing.T) {
	rep := orphanReport()
	rep.LeftRunning = append(rep.LeftRunning, attribution.LeftRunning{KernelID: "kernel-y", User: "bob", PID: 5000})
	rep.Hoarding = []attribution.UserHoarding{{User: "bob", GiBHours: 3}, {User: "alice", GiBHours: 1}}
	v := ownView(rep, "alice")
	if len(v.LeftRunning) != 1 || v.LeftRunning[0].User != "alice" || len(v.Hoarding) != 1 || v.Hoarding[0].User != "alice" {
		t.Errorf("alice's view: left running %+v, hoarding %+v", v.LeftRunning, v.Hoarding)
	}
}

func is404(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.StatusCode == http.StatusNotFound
}
