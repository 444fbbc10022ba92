package protocol

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

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
