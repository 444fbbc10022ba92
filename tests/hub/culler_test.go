package hub

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// culler runs rounds of jupyterhub-idle-culler's cull_idle from the locked
// stack, in process (testdata/cull_rounds.py) with its clock moved forward,
// against h, with jupyterlab_gpumem.hub from this tree.
type culler struct {
	h      *hub
	python string
	dir    string // its config files, readable by every user
	env    []string
}

func newCuller(t *testing.T, h *hub) *culler {
	t.Helper()
	python := venvBin(t, "python")
	out, err := exec.Command(python, "-c", "import jupyterhub_idle_culler as c; print(c.__version__)").CombinedOutput()
	need(t, err == nil, fmt.Sprintf("jupyterhub-idle-culler is not in %s (%v: %s): bash scripts/test.sh builds .venv/current from requirements/current.txt", python, err, out))
	if v := strings.TrimSpace(string(out)); !strings.HasPrefix(v, "2.") {
		t.Fatalf("jupyterhub-idle-culler %s, want 2.x (its cull_arbiter_hook)", v)
	}
	dir, err := os.MkdirTemp("", "gpumem-culler")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ext, err := filepath.Abs(filepath.Join("..", "..", "labextension"))
	if err != nil {
		t.Fatal(err)
	}
	return &culler{h: h, python: python, dir: dir, env: []string{
		"JUPYTERHUB_API_TOKEN=" + h.token,
		"PYTHONPATH=" + ext, // the arbiter of this tree, not an installed one
		"PATH=" + filepath.Dir(python) + ":/usr/bin:/bin", "LANG=C.UTF-8",
	}}
}

// config writes a culler config file holding the documented line with
// args and returns its path.
func (c *culler) config(t *testing.T, name, args string) string {
	t.Helper()
	p := filepath.Join(c.dir, name+".py")
	body := "from jupyterlab_gpumem.hub import GPUArbiter\n" +
		"c.IdleCuller.cull_arbiter_hook = GPUArbiter(" + args + ")\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// rounds runs one culler round per shift (the culler's clock that far
// ahead), in one process, as root, or as u when given, and returns what it
// logged.
func (c *culler) rounds(t *testing.T, u *testenv.User, config string, limit time.Duration, shifts ...time.Duration) string {
	t.Helper()
	argv := []string{c.python, filepath.Join(mustAbs(t, "testdata"), "cull_rounds.py"), c.h.url + "hub/api", config, fmt.Sprint(int(limit.Seconds()))}
	for _, s := range shifts {
		argv = append(argv, fmt.Sprint(int(s.Seconds())))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = c.env, c.dir
	if u != nil {
		cmd.Env = append(cmd.Env, "HOME="+u.Home, "USER="+u.Name)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("culler rounds %v: %v\n%s", shifts, err, out)
	}
	return string(out)
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// serverRunning reports whether u's default server is in the hub's model
// (a stopped one is not).
func (h *hub) serverRunning(t *testing.T, u testenv.User) bool {
	t.Helper()
	var model struct {
		Servers map[string]struct {
			Ready bool `json:"ready"`
		} `json:"servers"`
	}
	h.json(t, http.MethodGet, "hub/api/users/"+u.Name, nil, &model)
	_, ok := model.Servers[""]
	return ok
}

// startServers starts every user's server at once, then waits for each.
func (h *hub) startServers(t *testing.T, users ...testenv.User) {
	t.Helper()
	for _, u := range users {
		resp, err := h.do(http.MethodPost, "hub/api/users/"+u.Name+"/server", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted {
			t.Fatalf("start %s's server: %s", u.Name, resp.Status)
		}
	}
	for _, u := range users {
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
}

// keepAlive runs a short cell in nb's kernel every 2 s, as a frontend left
// open with a timer would, until the test ends; it prints a line per cell.
func (nb *notebook) keepAlive(t *testing.T) *testenv.Proc {
	t.Helper()
	script := `import sys, time
from jupyter_client import BlockingKernelClient
kc = BlockingKernelClient(connection_file=sys.argv[1])
kc.load_connection_file()
kc.start_channels()
kc.wait_for_ready(timeout=60)
n = 0
while True:
    r = kc.execute_interactive("_keepalive = %d" % n, timeout=30, store_history=False)
    n += 1
    print("cell", n, r["content"]["status"], flush=True)
    time.sleep(2)  # the user's cadence, not a wait for anything
`
	p := testenv.Start(t, []string{"PATH=/usr/bin:/bin"}, t.TempDir(), testenv.Python(), "-c", script, nb.connFile)
	testenv.Poll(t, 60*time.Second, "two keep-alive cells in "+nb.user.Name+"'s "+nb.path, func() bool {
		if p.Exited() {
			t.Fatalf("keep-alive exited:\n%s", p.Output())
		}
		return strings.Contains(p.Output(), "cell 2 ok")
	})
	return p
}
