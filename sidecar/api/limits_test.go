package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/sidecar/oom"
)

// Each uid has its own slots: one at its limit leaves the others theirs.
func TestInFlightPerUID(t *testing.T) {
	var f inFlight
	for _, c := range []struct {
		name  string
		uid   uint32
		limit int
		want  bool
	}{
		{"first of alice", 1001, 2, true},
		{"second of alice", 1001, 2, true},
		{"alice over her limit", 1001, 2, false},
		{"bob beside her", 1002, 2, true},
		{"alice under a higher limit", 1001, 3, true},
		{"alice at that one", 1001, 3, false},
	} {
		if got := f.acquire(c.uid, c.limit); got != c.want {
			t.Errorf("%s: acquire = %v, want %v", c.name, got, c.want)
		}
	}
	f.release(1001)
	if !f.acquire(1001, 3) {
		t.Error("a released slot is not free again")
	}
	for range 3 {
		f.release(1001)
	}
	f.release(1002)
	if len(f.n) != 0 {
		t.Errorf("uids with nothing in flight are kept: %v", f.n)
	}
}

// A uid with all its slots taken gets 429 with a sentence saying why,
// before the handler runs; another uid, and an admin past a user's limit,
// are served.
func TestLimitedAnswers429(t *testing.T) {
	s := NewServer(&fakeBackend{}, Options{Logger: zerolog.Nop()})
	s.daemonUID = 999
	for _, c := range []struct {
		name   string
		uid    uint32
		held   map[uint32]int
		status int
	}{
		{"a user under the limit", 1001, map[uint32]int{1001: maxInFlightUser - 1}, 200},
		{"a user at the limit", 1001, map[uint32]int{1001: maxInFlightUser}, 429},
		{"another user beside them", 1002, map[uint32]int{1001: maxInFlightUser}, 200},
		{"root past a user's limit", 0, map[uint32]int{0: maxInFlightUser}, 200},
		{"the daemon's user past a user's limit", 999, map[uint32]int{999: maxInFlightUser}, 200},
		{"root at its own limit", 0, map[uint32]int{0: maxInFlightAdmin}, 429},
	} {
		s.inFlight = inFlight{n: map[uint32]int{}}
		for uid, n := range c.held {
			s.inFlight.n[uid] = n
		}
		ran := false
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { ran = true })
		w := httptest.NewRecorder()
		s.limited(w, httptest.NewRequest("POST", "/api/v1/oom", strings.NewReader("{}")), Peer{PID: 1, UID: c.uid}, h)
		if w.Code != c.status || ran != (c.status == 200) {
			t.Errorf("%s: %d (handler ran: %v), want %d", c.name, w.Code, ran, c.status)
		}
		if c.status == 429 && (!strings.Contains(w.Body.String(), fmt.Sprintf("uid %d already has", c.uid)) || w.Header().Get("Retry-After") == "") {
			t.Errorf("%s: %s %v: want the uid, the count, and Retry-After", c.name, w.Body, w.Header())
		}
		if got := s.inFlight.n[c.uid]; got != c.held[c.uid] {
			t.Errorf("%s: %d in flight after the request, want %d again", c.name, got, c.held[c.uid])
		}
	}
}

// A uid's lines: the first logBurst of a window, then one notice, then
// nothing until the window ends, when the count is written; other uids
// keep their own budget.
func TestRefusalLogBurstAndSummary(t *testing.T) {
	now := time.Unix(1000, 0)
	var out bytes.Buffer
	log := zerolog.New(&out)
	l := refusalLog{now: func() time.Time { return now }}
	lines := func() int { return strings.Count(out.String(), "\n") }
	for _, c := range []struct {
		name      string
		advance   time.Duration
		uid       uint32
		n         int // calls
		allowed   int
		lines     int // lines written by these calls
		summaryOf int // dropped count a line of these calls must give; 0: none
	}{
		{"a burst", 0, 1001, logBurst, logBurst, 0, 0},
		{"past it: one notice", time.Second, 1001, 100, 0, 1, 0},
		{"another uid keeps its budget", time.Second, 1002, 2, 2, 0, 0},
		{"still in the window: nothing", 10 * time.Second, 1001, 50, 0, 0, 0},
		{"the next window: the count, then a new burst", logWindow, 1001, 1, 1, 1, 150},
	} {
		now = now.Add(c.advance)
		before := lines()
		allowed := 0
		for range c.n {
			if l.allow(log, c.uid) {
				allowed++
			}
		}
		written := out.String()[len(strings.Join(strings.SplitAfter(out.String(), "\n")[:before], "")):]
		if allowed != c.allowed || lines()-before != c.lines {
			t.Errorf("%s: %d allowed, %d lines (%s), want %d, %d", c.name, allowed, lines()-before, written, c.allowed, c.lines)
		}
		if c.summaryOf > 0 && !strings.Contains(written, fmt.Sprintf(`"dropped":%d`, c.summaryOf)) {
			t.Errorf("%s: %s, want the count of %d", c.name, written, c.summaryOf)
		}
	}
	// At the end of Serve, the counts of windows not over yet.
	for range logBurst + 3 {
		l.allow(log, 1003)
	}
	out.Reset()
	l.flush(log)
	if !strings.Contains(out.String(), `"dropped":3`) || !strings.Contains(out.String(), `"uid":1003`) {
		t.Errorf("flush wrote %s, want uid 1003's 3 dropped lines", out.String())
	}
}

// What a caller sent reaches the log only as a capped, escaped prefix;
// messages of other client errors not at all.
func TestRefusalLogCapsWhatCallersSent(t *testing.T) {
	id := strings.Repeat("\x1b[2J", 15000) // 60 KB of escape sequences
	for _, c := range []struct {
		name   string
		status int
		msg    string
		inLog  string // the message logged
	}{
		{"a refusal quoting the id", 403, "kernel " + id + " is not user bob's", "kernel \\x1b[2J"},
		{"a failure", 502, "kernel " + id + ": " + strings.Repeat("y", 1<<20), "kernel \\x1b[2J"},
		{"a bad request", 400, "body: " + id, "Bad Request"},
	} {
		var out bytes.Buffer
		s := NewServer(&fakeBackend{}, Options{Logger: zerolog.New(&out)})
		r := httptest.NewRequest(strings.Repeat("M", 1000), "/api/v1/kernels/x", nil)
		r.URL.Path = "/api/v1/kernels/" + id
		r = r.WithContext(context.WithValue(r.Context(), peerKey{}, peerResult{peer: Peer{PID: 7, UID: 1002}}))
		w := httptest.NewRecorder()
		s.writeError(w, r, c.status, c.msg)
		var line map[string]any
		if err := json.Unmarshal(out.Bytes(), &line); err != nil {
			t.Fatalf("%s: log %q: %v", c.name, out.String(), err)
		}
		if out.Len() > maxLoggedMsg+maxLoggedPath+300 || strings.Contains(out.String(), "\x1b") {
			t.Errorf("%s: a line of %d bytes: %.400s", c.name, out.Len(), out.String())
		}
		if msg, _ := line["message"].(string); !strings.HasPrefix(msg, c.inLog) || len(msg) > maxLoggedMsg {
			t.Errorf("%s: message %q, want %q at the start, at most %d bytes", c.name, msg, c.inLog, maxLoggedMsg)
		}
		if p, _ := line["path"].(string); len(p) > maxLoggedPath || !strings.HasPrefix(p, "/api/v1/kernels/") {
			t.Errorf("%s: path %q", c.name, p)
		}
		if m, _ := line["method"].(string); len(m) > 16 {
			t.Errorf("%s: method %q", c.name, m)
		}
		var reply errorBody
		if json.Unmarshal(w.Body.Bytes(), &reply) != nil || reply.Error != c.msg {
			t.Errorf("%s: the caller's reply lost the message", c.name)
		}
	}
}

// Through the socket, 300 refusals of one caller write a few lines.
func TestRefusalFloodLogsLittle(t *testing.T) {
	ts := startServer(t, "", ModePrivate, &fakeBackend{report: testReport()})
	path := "/api/v1/kernels/" + strings.Repeat("x", 30000)
	for range 300 {
		if st, _ := rawGet(t, ts.path, "GET", path); st != 404 {
			t.Fatalf("GET of an unknown kernel: %d", st)
		}
	}
	ts.stop()
	logs := ts.logs.String()
	if n := strings.Count(logs, "\n"); len(logs) > 4096 || n > logBurst+2 {
		t.Errorf("300 refusals wrote %d lines, %d bytes: %.600s", n, len(logs), logs)
	}
	if !strings.Contains(logs, `"dropped":295`) {
		t.Errorf("the log does not count the %d refusals left out: %s", 300-logBurst, logs)
	}
}

// Each body is bounded before it is decoded, by what its real clients
// send: a body over its endpoint's bound gets 413, one of a real size is
// read.
func TestBodyBounds(t *testing.T) {
	b := &whyBackend{fakeBackend: fakeBackend{report: testReport()}}
	b.setKernel(os.Getpid(), fakeKernel{id: "kernel-a", owner: uint32(os.Geteuid())})
	ts := startServerWith(t, "", ModePrivate, b, asAlice)
	over := func(n int) string { return `{"kind":"why","pad":"` + strings.Repeat("x", n) + `"}` }
	for _, c := range []struct {
		path   string
		limit  int
		real   string // a body of the size its clients send
		status int    // the answer to real
	}{
		{"/api/v1/kernels/kernel-a/why", maxWhyBody, over(200 << 10), 200},
		{"/api/v1/kernels/kernel-a/free", maxFreeBody, `{"vars":["x"]}`, 200},
		{"/api/v1/oom", oom.MaxRequestBody, `{"framework":"torch","message":"CUDA out of memory."}`, 404}, // no out-of-memory backend
		{"/api/v1/snapshots", maxSnapshotBody, `{"path":"/home/alice/s.pickle","reason":"manual"}`, 404},  // no snapshot backend
	} {
		st, body := rawPost(t, ts.path, c.path, "application/json", over(c.limit))
		if want := fmt.Sprintf("over %d bytes", c.limit); st != 413 || !strings.Contains(body, want) {
			t.Errorf("POST %s of %d bytes: %d %.200s, want 413 %q", c.path, len(over(c.limit)), st, body, want)
		}
		if st, body := rawPost(t, ts.path, c.path, "application/json", c.real); st != c.status {
			t.Errorf("POST %s of a real body: %d %.200s, want %d", c.path, st, body, c.status)
		}
	}
	if maxWhyBody > 1<<20 {
		t.Errorf("maxWhyBody is %d: a why body is kilobytes (see its comment)", maxWhyBody)
	}
}

// pidCounting counts the backend's /proc lookups of a caller's kernel.
type pidCounting struct {
	*fakeBackend
	lookups atomic.Int32
}

func (b *pidCounting) KernelOfPID(ctx context.Context, pid int) (string, uint32, bool) {
	b.lookups.Add(1)
	return b.fakeBackend.KernelOfPID(ctx, pid)
}

// The endpoints of a kernel speaking for itself refuse a caller whose uid
// owns no kernel of the last report from its credentials alone, without
// looking up its process; a kernel's owner is looked up, and refused when
// the process is no kernel's.
func TestCallerKernelRefusesFromCredentials(t *testing.T) {
	for _, c := range []struct {
		name    string
		user    string
		kernel  bool // the caller's pid is kernel-a's process
		status  int
		has     string
		lookups int32
	}{
		{"a user owning no kernel", "mallory", false, 403, "owns no kernel", 0},
		{"an owner's process outside their kernels", "alice", false, 403, "is not a process of a kernel", 1},
		{"the kernel's own process", "alice", true, 404, "no out-of-memory", 1}, // the fake records none
	} {
		b := &pidCounting{fakeBackend: &fakeBackend{report: testReport()}}
		if c.kernel {
			b.setKernel(os.Getpid(), fakeKernel{id: "kernel-a", owner: uint32(os.Geteuid())})
		}
		user := c.user
		ts := startServerWith(t, "", ModePrivate, b, func(s *Server) { s.userName = func(uint32) string { return user } })
		for _, path := range []string{"/api/v1/oom", "/api/v1/snapshots"} {
			b.lookups.Store(0)
			st, body := rawPost(t, ts.path, path, "application/json", `{"framework":"torch","path":"/x","reason":"manual"}`)
			if st != c.status || (c.status == 403 && !strings.Contains(body, c.has)) || b.lookups.Load() != c.lookups {
				t.Errorf("%s: POST %s: %d %.200s after %d lookups, want %d (%q) after %d", c.name, path, st, body, b.lookups.Load(), c.status, c.has, c.lookups)
			}
		}
	}
}
