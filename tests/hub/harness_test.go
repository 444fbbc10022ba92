package hub

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// asUser runs argv as u (uid, gid, HOME, USER) and returns its output and
// exit error.
func asUser(u testenv.User, env []string, argv ...string) (string, string, error) {
	return u.Run(env, argv...)
}

// hub is a running JupyterHub.
type hub struct {
	proc     *testenv.Proc
	url      string // the proxy's public URL, ending in /
	token    string // a service token that may start servers and reach them
	password string // every user's, at the hub's login form
	http     *http.Client
}

// venvBin is a program of the repository's .venv/current (built by
// scripts/test.sh from requirements/current.txt).
func venvBin(t *testing.T, name string) string {
	t.Helper()
	venv, err := filepath.EvalSymlinks(filepath.Join("..", "..", ".venv", "current"))
	if err == nil {
		venv, err = filepath.Abs(venv)
	}
	p := filepath.Join(venv, "bin", name)
	if err == nil {
		_, err = os.Stat(p)
	}
	need(t, err == nil, fmt.Sprintf("%s not found (%v): bash scripts/test.sh builds .venv/current from requirements/current.txt", p, err))
	return p
}

// startHub runs JupyterHub as root on 127.0.0.1 with LocalProcessSpawner,
// the given users allowed, and waits (90 s) until its API answers.
func startHub(t *testing.T, users ...testenv.User) *hub {
	t.Helper()
	return startHubWith(t, "", users...)
}

// startHubWith is startHub with more lines of jupyterhub_config.py (c.
// JupyterHub.services and c.JupyterHub.load_roles are lists there).
func startHubWith(t *testing.T, extra string, users ...testenv.User) *hub {
	t.Helper()
	need(t, os.Geteuid() == 0, "the JupyterHub test runs as root (useradd, spawning as other users)")
	jupyterhub := venvBin(t, "jupyterhub")
	singleuser := venvBin(t, "jupyterhub-singleuser")
	chp, err := filepath.Abs(filepath.Join("node_modules", ".bin", "configurable-http-proxy"))
	if err == nil {
		_, err = os.Stat(chp)
	}
	need(t, err == nil, fmt.Sprintf("configurable-http-proxy not found (%v): run npm ci in tests/hub (bash scripts/test.sh does)", err))

	dir := t.TempDir()
	port, hubPort, apiPort := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	token, password := testenv.RandomHex(24), testenv.RandomHex(16)
	var names []string
	for _, u := range users {
		names = append(names, fmt.Sprintf("%q", u.Name))
	}
	config := fmt.Sprintf(`
c = get_config()
c.JupyterHub.bind_url = "http://127.0.0.1:%d"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = %d
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:%d"
c.ConfigurableHTTPProxy.command = [%q]
c.JupyterHub.db_url = "sqlite:///" + %q
c.JupyterHub.cookie_secret_file = %q
c.JupyterHub.pid_file = %q
c.ConfigurableHTTPProxy.pid_file = %q
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = %q
c.Authenticator.allowed_users = {%s}
c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
c.Spawner.cmd = [%q]
# The tests run the root daemon: no per-user one from jupyterlab-gpumem.
c.Spawner.args = ["--Gpumem.autostart=False"]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
c.JupyterHub.services = [{"name": "gpumem-test", "api_token": %q}]
c.JupyterHub.load_roles = [{
    "name": "gpumem-test",
    "scopes": ["admin:users", "admin:servers", "access:servers", "list:users", "read:users"],
    "services": ["gpumem-test"],
}]
`, port, hubPort, apiPort, chp,
		filepath.Join(dir, "jupyterhub.sqlite"), filepath.Join(dir, "cookie_secret"),
		filepath.Join(dir, "jupyterhub.pid"), filepath.Join(dir, "proxy.pid"),
		password, strings.Join(names, ", "), singleuser, token)
	config += extra
	cfg := filepath.Join(dir, "jupyterhub_config.py")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + filepath.Dir(jupyterhub) + ":/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "LANG=C.UTF-8"}
	// The hub starts the proxy in a session of its own: killing the hub's
	// process group leaves it. Registered first, this runs after the hub
	// is killed, and ends the proxy the hub's pid file names, once its
	// argv shows it is this hub's (its API port).
	proxyPID := filepath.Join(dir, "proxy.pid")
	t.Cleanup(func() { killProxy(t, proxyPID, apiPort) })
	proc := testenv.Start(t, env, dir, jupyterhub, "-f", cfg, "--log-level=WARN")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("jupyterhub output:\n%s", proc.Output())
		}
	})
	h := &hub{proc: proc, url: fmt.Sprintf("http://127.0.0.1:%d/", port), token: token, password: password, http: &http.Client{Timeout: 60 * time.Second}}
	testenv.Poll(t, 90*time.Second, "JupyterHub's API on "+h.url, func() bool {
		if proc.Exited() {
			t.Fatalf("jupyterhub exited:\n%s", proc.Output())
		}
		resp, err := h.do(http.MethodGet, "hub/api/", nil)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return h
}

func (h *hub) do(method, path string, body any) (*http.Response, error) {
	req, err := testenv.JSONRequest(method, h.url+path, h.token, body)
	if err != nil {
		return nil, err
	}
	return h.http.Do(req)
}

// json sends a request and decodes the reply into out (if non-nil); a
// status outside 2xx fails the test.
func (h *hub) json(t *testing.T, method, path string, body, out any) {
	t.Helper()
	resp, err := h.do(method, path, body)
	testenv.ReplyJSON(t, method+" "+path, resp, err, out)
}

// startServer starts u's single-user server through the hub's API and
// waits (120 s) until the hub says it is ready.
func (h *hub) startServer(t *testing.T, u testenv.User) {
	t.Helper()
	resp, err := h.do(http.MethodPost, "hub/api/users/"+u.Name+"/server", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted {
		t.Fatalf("start %s's server: %s: %s", u.Name, resp.Status, b)
	}
	testenv.Poll(t, 120*time.Second, u.Name+"'s server ready", func() bool {
		var model struct {
			Servers map[string]struct {
				Ready bool `json:"ready"`
			} `json:"servers"`
		}
		h.json(t, http.MethodGet, "hub/api/users/"+u.Name, nil, &model)
		return model.Servers[""].Ready
	})
}

// notebook is a notebook of a user with a running kernel.
type notebook struct {
	user     testenv.User
	path     string // relative to the user's home
	kernelID string
	connFile string
	pid      int
}

// openNotebook creates path in u's home through u's server (via the proxy)
// and a session with a python3 kernel for it, and waits for the kernel's
// process.
func (h *hub) openNotebook(t *testing.T, u testenv.User, path string) *notebook {
	t.Helper()
	base := "user/" + u.Name + "/api/"
	content := map[string]any{"cells": []any{}, "metadata": map[string]any{}, "nbformat": 4, "nbformat_minor": 5}
	h.json(t, http.MethodPut, base+"contents/"+path, map[string]any{"type": "notebook", "content": content}, nil)
	var sess struct {
		Kernel struct {
			ID string `json:"id"`
		} `json:"kernel"`
	}
	h.json(t, http.MethodPost, base+"sessions", map[string]any{
		"path": path, "name": filepath.Base(path), "type": "notebook", "kernel": map[string]any{"name": "python3"},
	}, &sess)
	nb := &notebook{user: u, path: path, kernelID: sess.Kernel.ID,
		connFile: filepath.Join(u.RuntimeDir(), "kernel-"+sess.Kernel.ID+".json")}
	testenv.Poll(t, 60*time.Second, "the kernel process of "+u.Name+"'s "+path, func() bool {
		pids := testenv.KernelPIDs(nb.connFile)
		if len(pids) == 1 {
			nb.pid = pids[0]
			return true
		}
		return false
	})
	return nb
}

// cell runs code in nb's kernel as a frontend would (as root, which may
// read the user's connection file) and returns what it printed.
func (nb *notebook) cell(t *testing.T, code string) string {
	t.Helper()
	r := testenv.RunCell(t, nb.connFile, code, 60*time.Second)
	if r.Status != "ok" {
		t.Fatalf("cell in %s's %s: %s %s: %s", nb.user.Name, nb.path, r.EName, r.EValue, r.Stdout)
	}
	return r.Stdout
}

// childInOwnSession starts, from nb's kernel, a sleeping child in a new
// session (Jupyter's process-group kill misses it) and returns its pid.
func (nb *notebook) childInOwnSession(t *testing.T) int {
	t.Helper()
	out := nb.cell(t, "import subprocess, sys\n"+
		"_w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"+
		"print(_w.pid)")
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("child pid: %q", out)
	}
	return pid
}

// killProxy ends the configurable-http-proxy whose pid is in pidFile if its
// argv names apiPort, and waits (10 s) until it is gone.
func killProxy(t *testing.T, pidFile string, apiPort int) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return // never started
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Errorf("proxy pid file %s: %q", pidFile, b)
		return
	}
	// Only while the number is still the proxy's (pinned by a pidfd as
	// its argv is read): gone already, or another process's now, it is left.
	if !testenv.KillIf(pid, func(pid int) bool {
		argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && strings.Contains(string(argv), "configurable-http-proxy") &&
			strings.Contains(string(argv), "\x00--api-port\x00"+strconv.Itoa(apiPort)+"\x00")
	}) {
		return
	}
	testenv.Poll(t, 10*time.Second, "the proxy ended", func() bool { return !testenv.Alive(pid) })
}

// sharedSocket is the root daemon's socket path, in a temporary dir every
// user may enter (mode 0755), removed at the test's end.
func sharedSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpumem-hub-sock")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "gpumem.sock")
}
