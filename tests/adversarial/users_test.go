package adversarial

// Helpers of the scenarios where one user acts against another's kernels:
// two real accounts (testenv.MakeUser) and one root daemon serving both, set
// up as docs/shared-host.md says (--all-users, a shared socket in a dir of
// root's that every user reaches). Users reach the socket as themselves, so
// the daemon knows them by SO_PEERCRED.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// sharedDaemon starts `gpumem serve --all-users --reclaim-all-users
// --socket-mode shared` as root for users only, with its socket in a root
// dir of mode 0755; it returns the daemon and its socket.
func sharedDaemon(t *testing.T, gpu *testenv.FakeGPU, users []testenv.User, args ...string) (*testenv.Daemon, string) {
	t.Helper()
	return sharedDaemonEnv(t, gpu, users, nil, args...)
}

// sharedDaemonEnv is sharedDaemon with env added to the daemon's.
func sharedDaemonEnv(t *testing.T, gpu *testenv.FakeGPU, users []testenv.User, env []string, args ...string) (*testenv.Daemon, string) {
	t.Helper()
	testenv.RequireRoot(t, "the shared-host scenarios run a root daemon for real test accounts")
	sockDir, err := os.MkdirTemp("", "gpumem-shared-")
	if err == nil {
		err = os.Chmod(sockDir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "gpumem.sock")
	base := []string{"--all-users", "--reclaim-all-users", "--socket=" + sock, "--socket-mode=shared", "--interval=200ms", "--rescan=500ms"}
	for _, u := range users {
		base = append(base, "--users="+u.Name) // other tests' kernels may run on this machine
	}
	d := testenv.StartDaemonEnv(t, gpumemBin, jupyterDir(t), gpu, env, append(base, args...)...)
	return d, sock
}

// apiAs sends one request to the daemon's socket as user u (curl, run as u:
// the daemon sees u's uid) and returns the status and body.
func apiAs(t *testing.T, u testenv.User, sock, method, path, body string) (int, string) {
	t.Helper()
	argv := []string{"curl", "-sS", "--max-time", "40", "--unix-socket", sock, "-o", "-", "-w", "\n%{http_code}", "-X", method}
	if body != "" {
		argv = append(argv, "-H", "Content-Type: application/json", "--data", body)
	}
	argv = append(argv, "http://local-gpumem.sock"+path)
	stdout, stderr, err := u.Run(nil, argv...)
	if err != nil {
		t.Fatalf("curl %s %s as %s: %v: %s", method, path, u.Name, err, stderr)
	}
	i := strings.LastIndexByte(stdout, '\n')
	status, err := strconv.Atoi(strings.TrimSpace(stdout[i+1:]))
	if i < 0 || err != nil {
		t.Fatalf("curl %s %s as %s printed %q", method, path, u.Name, stdout)
	}
	return status, stdout[:i]
}

// crossUser counts what one user tried against another's kernels and what
// got through, for the run's summary (every scenario must end with none).
type crossUser struct {
	mu                 sync.Mutex
	reads, actions     int
	readsIn, actionsIn int
	what               []string
}

func (c *crossUser) read(t *testing.T, got bool, what string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	if got {
		c.readsIn++
		c.what = append(c.what, what)
		t.Errorf("cross-user read: %s", what)
	}
}

func (c *crossUser) action(t *testing.T, got bool, what string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.actions++
	if got {
		c.actionsIn++
		c.what = append(c.what, what)
		t.Errorf("cross-user action: %s", what)
	}
}

// summary logs the counts in one line the report quotes.
func (c *crossUser) summary(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Logf("cross-user: %d reads tried, %d got through; %d actions tried, %d got through",
		c.reads, c.readsIn, c.actions, c.actionsIn)
}

// hasVar reports whether the kernel behind connFile has a global named name.
func hasVar(t *testing.T, connFile, name string) bool {
	t.Helper()
	r := testenv.RunCell(t, connFile, fmt.Sprintf("print(%q in globals())", name), 60*time.Second)
	return strings.TrimSpace(r.Stdout) == "True"
}

// fakeServerPy is a stand-in Jupyter server that a user runs: it answers
// every GET and DELETE with argv[2] (a session list) and appends each
// request's path and Authorization header, as a JSON line, to argv[1]. It
// listens on 127.0.0.1 (printing its port) or, given argv[3], on that unix
// socket (printing 0).
const fakeServerPy = `
import http.server, json, os, socketserver, sys
log, sessions = sys.argv[1], sys.argv[2].encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "auth": self.headers.get("Authorization", "")}) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(sessions)))
        self.end_headers()
        self.wfile.write(sessions)
    do_DELETE = do_GET
    def address_string(self):
        return "local"
    def log_message(self, *a):
        pass
if len(sys.argv) > 3:
    class S(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True
    srv = S(sys.argv[3], H)
    port = 0
else:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    port = srv.server_address[1]
print(port, flush=True)
srv.serve_forever()
`

// fakeServer is a fakeServerPy run by a user.
type fakeServer struct {
	Port int
	log  string
}

// startFakeServer runs fakeServerPy as u, answering sessions (on sock, a
// unix socket path, when not ""), and waits for it to listen.
func startFakeServer(t *testing.T, u testenv.User, sessions, sock string) *fakeServer {
	t.Helper()
	fs := &fakeServer{log: filepath.Join(u.Home, "requests-"+testenv.RandomHex(4)+".jsonl")}
	argv := []string{"/usr/bin/python3", "-c", fakeServerPy, fs.log, sessions}
	if sock != "" {
		argv = append(argv, sock)
	}
	p := testenv.StartCmd(t, u.Command(nil, argv...))
	testenv.Poll(t, 30*time.Second, "the fake server of "+u.Name, func() bool {
		line, _, ok := strings.Cut(p.Output(), "\n")
		if !ok {
			return p.Exited() && t.Failed()
		}
		port, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			t.Fatalf("fake server printed %q", p.Output())
		}
		fs.Port = port
		return true
	})
	return fs
}

// Requests are the Authorization headers of the requests it got, in order
// ("" for none).
func (fs *fakeServer) Requests(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(fs.log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r struct{ Auth string }
		if line != "" && json.Unmarshal([]byte(line), &r) == nil {
			out = append(out, r.Auth)
		}
	}
	return out
}

// writeServerFile writes a jpserver-<n>.json of u's in dir (made as u).
func writeServerFile(t *testing.T, u testenv.User, dir string, fields map[string]any) string {
	t.Helper()
	u.Mkdir(t, dir)
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	var p string
	for i := 0; ; i++ {
		p = filepath.Join(dir, fmt.Sprintf("jpserver-%d.json", 40000+i))
		if _, err := os.Lstat(p); os.IsNotExist(err) {
			break
		}
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	return p
}

func itoa(n int) string { return strconv.Itoa(n) }
