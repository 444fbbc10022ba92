package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// leakMarkers identify goroutines that belong to this package or to zmq4.
var leakMarkers = []string{"go-zeromq/zmq4", "created by github.com/gpumem/gpumem/protocol"}

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if left := testenv.WaitGoroutinesGone(10*time.Second, leakMarkers...); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "%d goroutines leaked by the tests:\n\n%s\n", len(left), strings.Join(left, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// attach dials a kernel that may still be starting, and closes the client
// at the end of the test.
func attach(t testing.TB, connectionFile string, opts Options) *Client {
	t.Helper()
	var c *Client
	var last error
	deadline := time.Now().Add(60 * time.Second)
	for c == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, last = Dial(ctx, connectionFile, opts)
		cancel()
		if c == nil {
			if time.Now().After(deadline) {
				t.Fatalf("attach: %v", last)
			}
			time.Sleep(20 * time.Millisecond) // kernel still starting: poll
		}
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func waitEvent(t testing.TB, c *Client, kind EventKind, timeout time.Duration) Event {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var seen []string
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("events closed while waiting for %v; saw %v", kind, seen)
			}
			seen = append(seen, ev.String())
			if ev.Kind == kind {
				t.Logf("events: %v", seen)
				return ev
			}
		case <-deadline.C:
			t.Fatalf("no %v event within %v; saw %v", kind, timeout, seen)
		}
	}
}

func mustExecute(t testing.TB, c *Client, code string, opts ExecuteOptions) ExecuteReply {
	t.Helper()
	r, err := c.Execute(ctxFor(t, 20*time.Second), code, opts)
	if err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	return r
}

func exprJSON(t testing.TB, r ExecuteReply, name string, v any) {
	t.Helper()
	raw, err := r.UserExpressions[name].JSON()
	if err != nil {
		t.Fatalf("expression %s: %v (reply %+v)", name, err, r)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("expression %s: %v", name, err)
	}
}

func TestKernel(t *testing.T) {
	k := testenv.StartKernel(t, t.TempDir())
	c := attach(t, k.ConnectionFile, Options{})
	if ev := waitEvent(t, c, EventConnected, time.Second); ev.Session == "" || ev.Session != c.Session() {
		t.Fatalf("connected event %v, session %q", ev, c.Session())
	}

	t.Run("KernelInfo", func(t *testing.T) {
		ki, err := c.KernelInfo(ctxFor(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		// IPython 9's banner ends with a tip drawn at random for each reply.
		last := c.LastKernelInfo()
		last.Banner = ki.Banner
		if ki.Implementation != "ipython" || ki.Language != "python" || !strings.HasPrefix(ki.ProtocolVersion, "5.") ||
			ki.Session == "" || ki.Session != c.Session() || ki != last {
			t.Fatalf("kernel info %+v, session %q", ki, c.Session())
		}
		if !c.Alive() {
			t.Fatal("not alive")
		}
		if info := c.Info(); info.Path != k.ConnectionFile || info.Key != k.Key {
			t.Fatalf("info %+v", info)
		}
	})

	t.Run("Usage", func(t *testing.T) {
		pid, err := c.Usage(ctxFor(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if pid != k.Cmd.Process.Pid {
			t.Fatalf("usage pid %d, kernel pid %d", pid, k.Cmd.Process.Pid)
		}
	})

	t.Run("ExecuteExpressions", func(t *testing.T) {
		exprs := map[string]string{
			"json":  `type("J", (), {"_repr_json_": lambda self: {"answer": answer, "nested": [1, "two", None]}})()`,
			"plain": `answer + 1`,
			"fails": `undefined_name`,
		}
		{
			r := mustExecute(t, c, "answer = 42", ExecuteOptions{UserExpressions: exprs})
			if r.Err() != nil || r.Status != "ok" {
				t.Fatalf("%+v", r)
			}
			var got struct {
				Answer int   `json:"answer"`
				Nested []any `json:"nested"`
			}
			exprJSON(t, r, "json", &got)
			if got.Answer != 42 || len(got.Nested) != 3 {
				t.Fatalf("json expression %+v", got)
			}
			if _, err := r.UserExpressions["plain"].JSON(); !errors.Is(err, ErrNoJSON) || !strings.Contains(err.Error(), "43") {
				t.Fatalf("plain expression: %v", err)
			}
			if e := r.UserExpressions["fails"]; e.Status != "error" || e.EName != "NameError" {
				t.Fatalf("failing expression %+v", e)
			} else if _, err := e.JSON(); err == nil || !strings.Contains(err.Error(), "NameError") {
				t.Fatalf("failing expression JSON(): %v", err)
			}
		}
	})

	t.Run("ExecuteError", func(t *testing.T) {
		r := mustExecute(t, c, "def f():\n    raise ValueError('boom')\nf()", ExecuteOptions{})
		if r.Status != "error" || r.EName != "ValueError" || r.EValue != "boom" || r.Err() == nil {
			t.Fatalf("reply %+v", r)
		}
		if tb := strings.Join(r.Traceback, ""); !strings.Contains(tb, "boom") {
			t.Fatalf("traceback lacks the exception:\n%s", tb)
		}
		r = mustExecute(t, c, "def (", ExecuteOptions{})
		if r.EName != "SyntaxError" {
			t.Fatalf("reply %+v", r)
		}
	})

	t.Run("SentAsGiven", func(t *testing.T) { testSentAsGiven(t, c) })

	t.Run("IOPubFilter", func(t *testing.T) {
		// Once the status topic is learned, user output never reaches us.
		testenv.Poll(t, 10*time.Second, "an iopub status", func() bool {
			if c.ExecutionState() == "" {
				mustExecute(t, c, "pass", ExecuteOptions{})
				return false
			}
			return true
		})
		if _, err := c.KernelInfo(ctxFor(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		before := c.iopubOther.Load()
		r := mustExecute(t, c, "print('x' * 1000)\nfor i in range(50): print(i)\n1234", ExecuteOptions{NotSilent: true})
		if r.Status != "ok" {
			t.Fatalf("%+v", r)
		}
		testenv.Poll(t, 5*time.Second, "kernel idle", func() bool { return c.ExecutionState() == "idle" })
		if after := c.iopubOther.Load(); after != before {
			t.Fatalf("%d non-status iopub messages reached the client", after-before)
		}
	})

	t.Run("Busy", func(t *testing.T) { testBusy(t, c) })

	t.Run("WrongKey", func(t *testing.T) {
		info, err := ReadConnectionFile(k.ConnectionFile)
		if err != nil {
			t.Fatal(err)
		}
		info.Key = "not-" + info.Key
		start := time.Now()
		bad, err := DialInfo(ctxFor(t, 1500*time.Millisecond), info, Options{})
		elapsed := time.Since(start)
		if err == nil {
			bad.Close()
			t.Fatal("attach with a wrong key succeeded")
		}
		if !strings.Contains(err.Error(), "no reply: signature rejected or kernel unresponsive") ||
			!errors.Is(err, ErrNoReply) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error: %v", err)
		}
		if elapsed > 2*time.Second {
			t.Fatalf("took %v for a 1.5s deadline", elapsed)
		}
		t.Logf("%v after %v", err, elapsed.Round(time.Millisecond))
		// The kernel is unharmed.
		if _, err := c.KernelInfo(ctxFor(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Ping", func(t *testing.T) {
		start := time.Now()
		if err := Ping(ctxFor(t, 2*time.Second), c.Info()); err != nil {
			t.Fatal(err)
		}
		t.Logf("ping: %v", time.Since(start))
	})

	t.Run("Concurrent", func(t *testing.T) {
		errs := make(chan error, 40)
		for i := range 20 {
			go func() {
				if _, err := c.KernelInfo(ctxFor(t, 20*time.Second)); err != nil {
					errs <- err
					return
				}
				r, err := c.Execute(ctxFor(t, 20*time.Second), fmt.Sprintf("v%d = %d", i, i), ExecuteOptions{
					UserExpressions: map[string]string{"v": fmt.Sprintf(`type("V", (), {"_repr_json_": lambda self: {"v": v%d}})()`, i)}})
				if err == nil {
					var got struct{ V int }
					raw, jerr := r.UserExpressions["v"].JSON()
					if err = jerr; err == nil {
						if err = json.Unmarshal(raw, &got); err == nil && got.V != i {
							err = fmt.Errorf("request %d got the reply of %d", i, got.V)
						}
					}
				}
				errs <- err
			}()
		}
		for range 20 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("NoEventsOnHealthyKernel", func(t *testing.T) {
		select {
		case ev := <-c.Events():
			t.Fatalf("unexpected event %v", ev)
		default:
		}
		if c.decodeErrors.Load() != 0 {
			t.Fatalf("%d messages failed to decode", c.decodeErrors.Load())
		}
	})
}

// kernelState is the part of the kernel's state that a silent execute
// shows it touched.
type kernelState struct {
	Count        int    `json:"count"`
	LastValue    string `json:"last_value"`
	LastResultID int64  `json:"last_result_id"`
}

const stateProbe = `type("Probe", (), {"_repr_json_": lambda self: (lambda sys, ip: {
    "count": ip.execution_count,
    "last_value": repr(getattr(sys, "last_value", None)),
    "last_result_id": id(ip.last_execution_result),
})(__import__("sys"), get_ipython())})()`

func probe(t testing.TB, c *Client) kernelState {
	t.Helper()
	r := mustExecute(t, c, "", ExecuteOptions{UserExpressions: map[string]string{"state": stateProbe}})
	var s kernelState
	exprJSON(t, r, "state", &s)
	return s
}

// testSentAsGiven: Execute wraps nothing. A silent raise reaches IPython,
// which overwrites sys.last_value (and, on some versions,
// last_execution_result: why package magics wraps the code it sends), and
// uses up no execution_count.
func testSentAsGiven(t *testing.T, c *Client) {
	visible := ExecuteOptions{NotSilent: true, StoreHistory: true}
	first := mustExecute(t, c, "user_var = 1", visible)
	if first.ExecutionCount == 0 {
		t.Fatalf("visible execute has no execution_count: %+v", first)
	}
	before := probe(t, c)
	if before.Count != first.ExecutionCount+1 {
		t.Fatalf("baseline %+v after cell %d", before, first.ExecutionCount)
	}
	if r := mustExecute(t, c, "raise ValueError('raw')", ExecuteOptions{}); r.EName != "ValueError" || r.ExecutionCount != first.ExecutionCount {
		t.Fatalf("%+v", r)
	}
	if after := probe(t, c); !strings.Contains(after.LastValue, "raw") || after.Count != before.Count {
		t.Errorf("silent raise: before %+v after %+v", before, after)
	}
}

func touchCode(marker, then string) string {
	return fmt.Sprintf("import pathlib, time\npathlib.Path(%q).touch()\n%s", marker, then)
}

func exists(path string) func() bool {
	return func() bool { _, err := os.Stat(path); return err == nil }
}

func testBusy(t *testing.T, c *Client) {
	dir := t.TempDir()
	type result struct {
		r   ExecuteReply
		err error
		at  time.Time
	}
	run := func(code string, opts ExecuteOptions, timeout time.Duration) chan result {
		ch := make(chan result, 1)
		ctx := ctxFor(t, timeout)
		go func() {
			r, err := c.Execute(ctx, code, opts)
			ch <- result{r, err, time.Now()}
		}()
		return ch
	}
	visible := ExecuteOptions{NotSilent: true}

	// A long cell: control still answers within a second; Interrupt ends it.
	marker := filepath.Join(dir, "busy30")
	long := run(touchCode(marker, "time.sleep(30)"), visible, 40*time.Second)
	testenv.Poll(t, 20*time.Second, "the cell to start", exists(marker))
	for _, name := range []string{"KernelInfo", "Usage"} {
		start := time.Now()
		var err error
		if name == "KernelInfo" {
			_, err = c.KernelInfo(ctxFor(t, time.Second))
		} else {
			_, err = c.Usage(ctxFor(t, time.Second))
		}
		if d := time.Since(start); err != nil || d >= time.Second {
			t.Fatalf("%s while busy: %v after %v", name, err, d)
		} else {
			t.Logf("%s while busy: %v", name, d)
		}
	}
	if c.ExecutionState() != "busy" {
		t.Errorf("execution state %q while busy", c.ExecutionState())
	}
	if err := c.Interrupt(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-long:
		if res.err != nil || res.r.EName != "KeyboardInterrupt" {
			t.Fatalf("interrupted cell: %+v, %v", res.r, res.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("interrupt did not end the cell")
	}

	// A shorter cell: a silent Execute waits its turn. One with too short a
	// deadline gives up with ErrNoReply; its late reply is dropped.
	marker = filepath.Join(dir, "busy3")
	short := run(touchCode(marker, "time.sleep(3)"), visible, 20*time.Second)
	testenv.Poll(t, 20*time.Second, "the cell to start", exists(marker))
	_, err := c.Execute(ctxFor(t, 300*time.Millisecond), "pass", ExecuteOptions{})
	if !errors.Is(err, ErrNoReply) {
		t.Fatalf("execute behind a busy cell with a short deadline: %v", err)
	}
	start := time.Now()
	r, err := c.Execute(ctxFor(t, 15*time.Second), "waited = True", ExecuteOptions{
		UserExpressions: map[string]string{"v": `type("V", (), {"_repr_json_": lambda self: {"waited": waited}})()`}})
	if err != nil || r.Status != "ok" {
		t.Fatalf("execute behind a busy cell: %+v, %v", r, err)
	}
	waited := time.Since(start)
	var v struct{ Waited bool }
	exprJSON(t, r, "v", &v)
	if !v.Waited || waited < time.Second {
		t.Fatalf("execute answered after %v, before the busy cell could have ended", waited)
	}
	select {
	case res := <-short:
		if res.err != nil || res.r.Status != "ok" {
			t.Fatalf("busy cell: %+v, %v", res.r, res.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the busy cell has no reply although ours came")
	}
	t.Logf("silent execute waited %v behind the busy cell", waited.Round(time.Millisecond))
}

// TestKill9: a kernel killed with SIGKILL is reported dead within 3 s;
// Close while the client keeps trying leaves no goroutine behind.
func TestKill9(t *testing.T) {
	k := testenv.StartKernel(t, t.TempDir())
	c := attach(t, k.ConnectionFile, Options{})
	waitEvent(t, c, EventConnected, time.Second)
	if !c.Alive() {
		t.Fatal("not alive after attach")
	}
	start := time.Now()
	if err := syscall.Kill(-k.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Poll(t, 3*time.Second, "Alive() false", func() bool { return !c.Alive() })
	ev := waitEvent(t, c, EventDisconnected, 3*time.Second-time.Since(start))
	t.Logf("disconnected after %v: %v", ev.Time.Sub(start).Round(time.Millisecond), ev.Err)
	ev = waitEvent(t, c, EventDead, 3*time.Second-time.Since(start))
	if d := ev.Time.Sub(start); d > 3*time.Second {
		t.Fatalf("dead reported after %v", d)
	} else {
		t.Logf("dead after %v: %v", d.Round(time.Millisecond), ev.Err)
	}

	if err := Ping(ctxFor(t, 500*time.Millisecond), c.Info()); err == nil {
		t.Fatal("ping answered by a killed kernel")
	}

	// Requests fail within their deadline while the client retries.
	t0 := time.Now()
	if _, err := c.KernelInfo(ctxFor(t, 300*time.Millisecond)); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("request while disconnected: %v", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("request took %v", d)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	ev = waitEvent(t, c, EventClosed, time.Second)
	if ev.Err != nil {
		t.Fatalf("closed event after Close carries %v", ev.Err)
	}
	if _, ok := <-c.Events(); ok {
		t.Fatal("events channel still open after Close")
	}
	if _, err := c.KernelInfo(ctxFor(t, time.Second)); !errors.Is(err, ErrClosed) {
		t.Fatalf("request after Close: %v", err)
	}
	testenv.WaitNoGoroutines(t, 5*time.Second, leakMarkers...)
}

// TestRestartThroughServer: a restart through the REST API is followed by
// the client alone; shutdown (connection file deleted) stops it.
func TestRestartThroughServer(t *testing.T) {
	for _, kind := range testenv.ServerKinds() {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			testRestartThroughServer(t, kind)
		})
	}
}

func testRestartThroughServer(t *testing.T, kind testenv.ServerKind) {
	s := testenv.StartServer(t, kind)
	sess := s.CreateSession(t, "a/b.ipynb")
	c := attach(t, s.ConnectionFile(sess.Kernel.ID), Options{})
	waitEvent(t, c, EventConnected, time.Second)
	oldPID, err := c.Usage(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	oldSession, oldInfo := c.Session(), c.Info()

	s.JSON(t, http.MethodPost, "api/kernels/"+sess.Kernel.ID+"/restart", nil, nil)
	ev := waitEvent(t, c, EventRestarted, 90*time.Second) // a loaded 2-core CI box restarts slowly
	if ev.Session == "" || ev.Session == oldSession || ev.Session != c.Session() {
		t.Fatalf("restarted event %v; old session %s, now %s", ev, oldSession, c.Session())
	}
	if !c.Alive() {
		t.Fatal("not alive after restart")
	}
	newPID, err := c.Usage(ctxFor(t, 5*time.Second))
	if err != nil || newPID == oldPID {
		t.Fatalf("usage after restart: pid %d (was %d), %v", newPID, oldPID, err)
	}
	r := mustExecute(t, c, "", ExecuteOptions{UserExpressions: map[string]string{
		"pid": `type("P", (), {"_repr_json_": lambda self: {"pid": __import__("os").getpid()}})()`}})
	var got struct{ PID int }
	exprJSON(t, r, "pid", &got)
	if got.PID != newPID {
		t.Fatalf("execute after restart ran in pid %d, want %d", got.PID, newPID)
	}
	// A restart through the server keeps the connection file, its ports and
	// its key (jupyter_client 7.4 and 8.10 alike, measured here).
	if ni := c.Info(); ni.ShellPort != oldInfo.ShellPort || ni.IOPubPort != oldInfo.IOPubPort || ni.ControlPort != oldInfo.ControlPort ||
		ni.HBPort != oldInfo.HBPort || ni.Key != oldInfo.Key {
		t.Errorf("restart changed the connection: %+v → %+v", oldInfo, ni)
	}
	t.Logf("restart: pid %d → %d, session %s → %s, same ports and key", oldPID, newPID, oldSession, ev.Session)

	// Shutting the kernel down deletes its connection file: the client stops.
	resp, err := s.Do(http.MethodDelete, "api/sessions/"+sess.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ev = waitEvent(t, c, EventClosed, 30*time.Second)
	if !errors.Is(ev.Err, ErrConnectionFileDeleted) {
		t.Fatalf("closed event %v: want ErrConnectionFileDeleted", ev)
	}
	if _, err := c.KernelInfo(ctxFor(t, time.Second)); !errors.Is(err, ErrClosed) || !errors.Is(err, ErrConnectionFileDeleted) {
		t.Fatalf("request after shutdown: %v", err)
	}
	if c.Alive() {
		t.Fatal("alive after shutdown")
	}
}

// TestReconnectNewPorts: after a kernel dies, a new one is started from a
// rewritten connection file with other ports; the client re-reads the file
// and follows it.
func TestReconnectNewPorts(t *testing.T) {
	k := testenv.StartKernel(t, t.TempDir())
	c := attach(t, k.ConnectionFile, Options{})
	waitEvent(t, c, EventConnected, time.Second)
	oldSession, oldShell := c.Session(), c.Info().ShellPort
	if err := syscall.Kill(-k.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, EventDead, 3*time.Second)
	testenv.ConnectionJSON(t, k.ConnectionFile, k.Key)
	p := testenv.Start(t, testenv.Env(k.Dir), k.Dir, testenv.Python(), "-m", "ipykernel_launcher", "-f", k.ConnectionFile)
	ev := waitEvent(t, c, EventRestarted, 90*time.Second) // a loaded 2-core CI box restarts slowly
	if ev.Session == oldSession || c.Info().ShellPort == oldShell {
		t.Fatalf("restarted %v: session %s → %s, shell port %d → %d", ev, oldSession, ev.Session, oldShell, c.Info().ShellPort)
	}
	if pid, err := c.Usage(ctxFor(t, 5*time.Second)); err != nil || pid != p.Cmd.Process.Pid {
		t.Fatalf("usage: %d, %v; new kernel pid %d", pid, err, p.Cmd.Process.Pid)
	}
}

// TestHeartbeatMissed: a stopped kernel (SIGSTOP) keeps its connections
// open but answers nothing: the heartbeat notices, the client rebuilds its
// sockets, and when the kernel continues it reports the same session.
func TestHeartbeatMissed(t *testing.T) {
	k := testenv.StartKernel(t, t.TempDir())
	opts := Options{HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: 300 * time.Millisecond,
		ConnectTimeout: time.Second, MaxBackoff: 200 * time.Millisecond}
	c := attach(t, k.ConnectionFile, opts)
	waitEvent(t, c, EventConnected, time.Second)
	session := c.Session()
	pgid := -k.Cmd.Process.Pid
	if err := syscall.Kill(pgid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pgid, syscall.SIGCONT) })
	start := time.Now()
	ev := waitEvent(t, c, EventDisconnected, 3*time.Second)
	if !errors.Is(ev.Err, ErrHeartbeatMissed) || c.Alive() {
		t.Fatalf("disconnected %v, alive %v", ev, c.Alive())
	}
	t.Logf("heartbeat miss reported after %v", time.Since(start).Round(time.Millisecond))
	// Attempts time out in the handshake (the stopped kernel accepts TCP
	// but never greets); requests fail at their deadline meanwhile.
	if _, err := c.KernelInfo(ctxFor(t, 500*time.Millisecond)); err == nil {
		t.Fatal("request answered by a stopped kernel")
	}
	if err := syscall.Kill(pgid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	ev = waitEvent(t, c, EventReconnected, 15*time.Second)
	if ev.Session != session || !c.Alive() {
		t.Fatalf("reconnected %v (session was %s), alive %v", ev, session, c.Alive())
	}
	if _, err := c.KernelInfo(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestUnsignedKernel: an empty key means unsigned messages both ways.
func TestUnsignedKernel(t *testing.T) {
	testenv.Require(t, "ipykernel")
	dir := t.TempDir()
	cf := filepath.Join(dir, "runtime", "kernel-unsigned.json")
	testenv.ConnectionJSON(t, cf, "")
	testenv.Start(t, testenv.Env(dir), dir, testenv.Python(), "-m", "ipykernel_launcher", "-f", cf)
	c := attach(t, cf, Options{})
	if c.Info().Key != "" {
		t.Fatalf("key %q", c.Info().Key)
	}
	r := mustExecute(t, c, "", ExecuteOptions{UserExpressions: map[string]string{
		"v": `type("V", (), {"_repr_json_": lambda self: {"ok": True}})()`}})
	var v struct{ OK bool }
	exprJSON(t, r, "v", &v)
	if !v.OK {
		t.Fatalf("%+v", r)
	}
}

// TestIPCKernel: transport ipc (unix sockets named <ip>-<port>).
func TestIPCKernel(t *testing.T) {
	testenv.Require(t, "ipykernel")
	dir := t.TempDir()
	cf := filepath.Join(dir, "runtime", "kernel-ipc.json")
	if err := os.MkdirAll(filepath.Dir(cf), 0o700); err != nil {
		t.Fatal(err)
	}
	conn := fmt.Sprintf(`{"transport": "ipc", "ip": %q, "shell_port": 1, "iopub_port": 2, "stdin_port": 3,
		"control_port": 4, "hb_port": 5, "key": "k", "signature_scheme": "hmac-sha256"}`, filepath.Join(dir, "runtime", "kernel-ipc"))
	if err := os.WriteFile(cf, []byte(conn), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testenv.Start(t, testenv.Env(dir), dir, testenv.Python(), "-m", "ipykernel_launcher", "-f", cf)
	c := attach(t, cf, Options{})
	if pid, err := c.Usage(ctxFor(t, 5*time.Second)); err != nil || pid != p.Cmd.Process.Pid {
		t.Fatalf("usage over ipc: %d, %v", pid, err)
	}
}

// connectionsTo counts this process's established TCP connections to port
// on the loopback address, from /proc: what the kernel sees connected.
func connectionsTo(t *testing.T, port int) int {
	t.Helper()
	ours := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		link, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			ours[strings.TrimSuffix(inode, "]")] = true
		}
	}
	data, err := os.ReadFile("/proc/self/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	remote := fmt.Sprintf(":%04X", port)
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
		if len(f) > 9 && strings.HasSuffix(f[2], remote) && f[3] == "01" && ours[f[9]] {
			n++
		}
	}
	return n
}

// eventLog is an Options.OnEvent that records the events.
type eventLog struct {
	mu  sync.Mutex
	evs []Event
}

func (l *eventLog) add(ev Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, ev)
}

func (l *eventLog) has(kind EventKind) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.evs {
		if ev.Kind == kind {
			return true
		}
	}
	return false
}

// TestLean: a lean client holds only iopub between requests, and costs one
// goroutine when its events go to OnEvent, yet its requests, the kernel's
// execution state and a killed kernel's detection work as with a full
// client.
func TestLean(t *testing.T) {
	k := testenv.StartKernel(t, t.TempDir())
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	before := runtime.NumGoroutine()
	var events eventLog
	c := attach(t, k.ConnectionFile, Options{Lean: true, LeanIdle: 100 * time.Millisecond, OnEvent: events.add})
	if !events.has(EventConnected) {
		t.Fatal("OnEvent got no EventConnected before Dial returned")
	}
	info := c.Info()
	if n := connectionsTo(t, info.HBPort); n != 0 {
		t.Fatalf("lean client holds %d heartbeat connections, want none", n)
	}
	if n := connectionsTo(t, info.IOPubPort); n != 1 {
		t.Fatalf("lean client holds %d iopub connections, want 1", n)
	}
	// kernel_info went out on control at the attach; the socket goes once idle.
	testenv.Poll(t, 5*time.Second, "control socket closed once idle", func() bool {
		return connectionsTo(t, info.ControlPort) == 0
	})
	// The client's own goroutine reads iopub; zmq4 runs none for it.
	testenv.Poll(t, 5*time.Second, "one goroutine for the idle client", func() bool {
		return runtime.NumGoroutine() == before+1
	})

	// Two requests at once share one shell socket, dialed for them.
	var wg sync.WaitGroup
	replies := make([]ExecuteReply, 2)
	for i := range replies {
		wg.Go(func() {
			replies[i] = mustExecute(t, c, "import time; time.sleep(0.5); x = 6 * 7", ExecuteOptions{UserExpressions: map[string]string{"x": "x"}})
		})
	}
	testenv.Poll(t, 5*time.Second, "execution state busy (from iopub)", func() bool { return c.ExecutionState() == "busy" })
	if n := connectionsTo(t, info.ShellPort); n != 1 {
		t.Fatalf("%d shell connections during two requests, want 1", n)
	}
	wg.Wait()
	for _, r := range replies {
		if x := string(r.UserExpressions["x"].Data["text/plain"]); x != `"42"` {
			t.Fatalf("x = %s, want \"42\" (reply %+v)", x, r)
		}
	}
	testenv.Poll(t, 5*time.Second, "shell socket closed once idle", func() bool {
		return connectionsTo(t, info.ShellPort) == 0
	})
	testenv.Poll(t, 5*time.Second, "execution state idle", func() bool { return c.ExecutionState() == "idle" })
	if !c.Alive() {
		t.Fatal("lean client not alive with iopub connected")
	}

	// No heartbeat: the kernel's death is seen on iopub.
	if err := syscall.Kill(-k.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Poll(t, 3*time.Second, "EventDisconnected and EventDead", func() bool {
		return events.has(EventDisconnected) && events.has(EventDead)
	})
	if c.Alive() {
		t.Fatal("alive after the kernel was killed")
	}
	if cap(c.Events()) != 0 || len(c.Events()) != 0 {
		t.Fatal("Events() carries events beside OnEvent")
	}
}

// TestLeanDialWaitKeepsDeadline: a request that finds another's dial of
// the shell socket under way waits for it only until its own deadline. The
// shell port here accepts TCP and never answers ZeroMQ's greeting, so the
// first dial hangs until the connect timeout.
func TestLeanDialWaitKeepsDeadline(t *testing.T) {
	k := testenv.StartKernel(t, t.TempDir())
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	info, err := ReadConnectionFile(k.ConnectionFile)
	if err != nil {
		t.Fatal(err)
	}
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		for {
			select {
			case c := <-accepted:
				c.Close()
			default:
				return
			}
		}
	})
	info.ShellPort = silent.Addr().(*net.TCPAddr).Port
	const connectTimeout = 3 * time.Second
	c, err := DialInfo(ctxFor(t, 10*time.Second), info, Options{Lean: true, ConnectTimeout: connectTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })

	first := make(chan error, 1)
	go func() {
		_, err := c.Execute(ctxFor(t, 20*time.Second), "pass", ExecuteOptions{})
		first <- err
	}()
	var conn net.Conn
	select {
	case conn = <-accepted: // the first request's dial is under way
		accepted <- conn
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never dialed the shell port")
	}
	start := time.Now()
	_, err = c.Execute(ctxFor(t, 300*time.Millisecond), "pass", ExecuteOptions{})
	if took := time.Since(start); err == nil || took > time.Second {
		t.Fatalf("second request: %v after %v, want its deadline's error within 1 s", err, took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second request: %v, want the deadline", err)
	}
	select {
	case err := <-first:
		if err == nil {
			t.Fatal("the first request succeeded on a shell port that never answers")
		}
		t.Logf("first request: %v", err)
	case <-time.After(connectTimeout + 10*time.Second):
		t.Fatal("the first request's dial outlived the connect timeout")
	}
}
