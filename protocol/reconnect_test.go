package protocol

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

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
