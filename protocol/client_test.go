package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
