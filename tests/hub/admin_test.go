package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// TestHubAdminPage: the admins' page of the GPU box
// (jupyterlab_gpumem.hubadmin), run by a real JupyterHub as the documented
// service, with the root daemon in shared mode, a trainer whose worker
// computes and an idle user holding 12 GiB:
//   - an admin signed in through the hub's OAuth sees both users, their
//     servers and notebooks with the daemon's own bytes and verdicts, and
//     the arbiter's plan for each server;
//   - the idle user, signed in, gets 403 on the page, its JSON and its
//     actions, and none of the trainer's names;
//   - in Chromium, light and dark at 1280 and 800 px, nothing sticks out
//     sideways; the admin frees the idle notebook's caches through its
//     row's button and the confirmation, and the page says what was done;
//   - the admin stops the idle user's server (confirmed first), the hub
//     stops it, the trainer is untouched, and both actions are logged with
//     the admin's name.
func TestHubAdminPage(t *testing.T) {
	need(t, os.Geteuid() == 0, "the JupyterHub test runs as root (useradd, spawning as other users)")
	testenv.Require(t, "jupyter_client")
	trainer, idler := testenv.MakeUser(t, "train"), testenv.MakeUser(t, "idle")
	const admin = "gpuadmin" // signs in at the hub; needs no account, runs no server

	sock := sharedSocket(t)
	python := venvBin(t, "python")
	ext := mustAbs(t, filepath.Join("..", "..", "labextension"))
	servicePort := testenv.FreePort(t)
	// The documented service lines, with this tree's package on the path.
	extra := fmt.Sprintf(`
c.Authenticator.admin_users = {%q}
c.JupyterHub.services.append({
    "name": "gpumem",
    "url": "http://127.0.0.1:%d",
    "command": [%q, "-m", "jupyterlab_gpumem.hubadmin", "--socket=%s", "--cull-timeout=3600", "--poll=1"],
    "oauth_no_confirm": True,
    "environment": {"PYTHONPATH": %q},
})
c.JupyterHub.load_roles.append({
    "name": "gpumem", "services": ["gpumem"],
    "scopes": ["list:users", "read:users", "read:servers", "admin:servers"],
})
c.JupyterHub.load_roles.append({"name": "gpumem-viewers", "users": [%q], "scopes": ["access:services!service=gpumem"]})
`, admin, servicePort, python, sock, ext, trainer.Name)
	// The hub starts its services in sessions of their own: killing the
	// hub leaves this one, ended here by its argv (this test's socket).
	t.Cleanup(func() { killByArgv(t, "jupyterlab_gpumem.hubadmin", "--socket="+sock) })
	h := startHubWith(t, extra, trainer, idler)
	h.startServers(t, trainer, idler)
	nbT := h.openNotebook(t, trainer, "train.ipynb")
	workerT := nbT.childInOwnSession(t)
	nbI := h.openNotebook(t, idler, "idle.ipynb")

	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: nbT.pid, UsedBytes: 2 * gib},
		testenv.FakeProc{PID: workerT, UsedBytes: 20 * gib, SMPercent: 90, MemoryPercent: 40},
		testenv.FakeProc{PID: nbI.pid, UsedBytes: 12 * gib})
	d := testenv.StartDaemon(t, gpumemBin, t.TempDir(), gpu, "--all-users",
		"--users="+trainer.Name, "--users="+idler.Name,
		"--socket="+sock, "--socket-mode=shared", "--interval=500ms", "--compute-window=5s")
	waitVerdicts(t, d, map[string]string{nbT.kernelID: attribution.ComputeComputing, nbI.kernelID: attribution.ComputeIdle})

	adminC := h.login(t, admin)
	t.Run("an admin sees every user, the daemon's figures and the arbiter's plan", func(t *testing.T) {
		// The arbiter's verdicts settle once the daemon has proven and
		// judged both kernels and their servers report them idle.
		var view adminView
		miss := "no view yet"
		defer func() {
			if t.Failed() {
				t.Logf("the last view's mismatch: %s", miss)
			}
		}()
		testenv.Poll(t, 60*time.Second, "the admin page's view of both users and their plans", func() bool {
			view = adminView{}
			status, body := get(t, adminC, h.url+"services/gpumem/api/view")
			if status != http.StatusOK {
				miss = fmt.Sprintf("GET api/view: %d %s", status, body)
				return false
			}
			if err := json.Unmarshal([]byte(body), &view); err != nil {
				t.Fatalf("api/view: %v\n%s", err, body)
			}
			miss = view.mismatch(trainer.Name, nbT.kernelID, 22*gib, attribution.ComputeComputing, "veto", "computes on a GPU") +
				view.mismatch(idler.Name, nbI.kernelID, 12*gib, attribution.ComputeIdle, "keep", "(limit 01:00:00)")
			return miss == ""
		})
		status, page := get(t, adminC, h.url+"services/gpumem/")
		if status != http.StatusOK {
			t.Fatalf("GET the page as an admin: %d\n%s", status, page)
		}
		page = html.UnescapeString(page)
		for _, want := range []string{trainer.Name, idler.Name, "train.ipynb", "idle.ipynb", "22.0 GiB", "12.0 GiB", "Stop server…", "Free cache…"} {
			if !strings.Contains(page, want) {
				t.Errorf("the page lacks %q", want)
			}
		}
	})

	t.Run("a user who is not an admin gets 403 and nothing of another's", func(t *testing.T) {
		// The idle user may not use the service at all: the hub refuses.
		// The trainer was given the service by a role (as an admin might,
		// hoping users see their own): the service itself refuses.
		for _, u := range []testenv.User{idler, trainer} {
			c := h.login(t, u.Name)
			other := trainer
			if u == trainer {
				other = idler
			}
			for _, path := range []string{"services/gpumem/", "services/gpumem/api/view"} {
				status, body := get(t, c, h.url+path)
				if status != http.StatusForbidden {
					t.Errorf("GET %s as %s: %d, want 403\n%s", path, u.Name, status, body)
				}
				for _, secret := range []string{other.Name, "train.ipynb", "idle.ipynb", nbT.kernelID, nbI.kernelID} {
					if strings.Contains(body, secret) {
						t.Errorf("GET %s as %s shows %q", path, u.Name, secret)
					}
				}
			}
			// With the service's own _xsrf cookie, where it set one, so
			// that only the admin check stands in the way.
			xsrf := "none"
			for _, ck := range c.Jar.Cookies(mustURL(t, h.url+"services/gpumem/")) {
				if ck.Name == "_xsrf" {
					xsrf = ck.Value
				}
			}
			status, body := post(t, c, h.url+"services/gpumem/action", url.Values{
				"_xsrf": {xsrf}, "action": {"stop"}, "user": {other.Name}, "server": {""}, "confirm": {"yes"},
			})
			if status != http.StatusForbidden {
				t.Errorf("POST a stop of %s's server as %s: %d, want 403\n%s", other.Name, u.Name, status, body)
			}
			if !h.serverRunning(t, other) {
				t.Fatalf("%s, not an admin, stopped %s's server", u.Name, other.Name)
			}
		}
		mustLog(t, h.proc.Output(), `gpumem-admin: refused GET /services/gpumem/ to '`+trainer.Name+`': not one of the hub's admins`)
	})

	t.Run("in Chromium: light and dark, 1280 and 800 px, and a free through the page", func(t *testing.T) {
		_, err := os.Stat("/usr/bin/chromium")
		need(t, err == nil, "Debian's chromium is not installed (apt-get install chromium): bash scripts/test.sh installs it")
		out := artifacts(t)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, python, filepath.Join(mustAbs(t, "testdata"), "admin_page.py"), h.url, admin, idler.Name, h.password, out, idler.Name)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "LANG=C.UTF-8"}
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("admin_page.py: %v\n%s", err, b)
		}
		var res struct {
			Screenshots   []string        `json:"screenshots"`
			Overflow      map[string]bool `json:"overflow"`
			Confirm       string          `json:"confirm"`
			Flash         string          `json:"flash"`
			NonadminCode  int             `json:"nonadmin_status"`
			NonadminShown string          `json:"nonadmin_text"`
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
			t.Fatalf("admin_page.py's answer: %v\n%s", err, b)
		}
		t.Logf("admin page in Chromium: %+v", res)
		for k, over := range res.Overflow {
			if over {
				t.Errorf("the page scrolls sideways at %s", k)
			}
		}
		if !strings.Contains(res.Confirm, "Free the caches of "+idler.Name+"'s notebook idle.ipynb") || !strings.Contains(res.Confirm, "12.0 GiB") {
			t.Errorf("the confirmation says %q", res.Confirm)
		}
		if !strings.HasPrefix(res.Flash, "Freed the caches of "+idler.Name+"'s idle.ipynb: ") {
			t.Errorf("after the free the page says %q", res.Flash)
		}
		if res.NonadminCode != http.StatusForbidden || strings.Contains(res.NonadminShown, trainer.Name) {
			t.Errorf("a non-admin in the browser got %d: %q", res.NonadminCode, res.NonadminShown)
		}
		if os.Getenv("GPUMEM_UPDATE_SCREENSHOT") == "1" {
			for _, p := range res.Screenshots {
				copyFile(t, p, filepath.Join("..", "..", "docs", "screenshots", filepath.Base(p)))
			}
		}
		testenv.Poll(t, 30*time.Second, "the free in the hub's log", func() bool {
			return strings.Contains(h.proc.Output(), "gpumem-admin: "+admin+" freed the caches of "+idler.Name+"'s idle.ipynb (kernel "+nbI.kernelID)
		})
	})

	t.Run("an admin stops a server, confirmed first and logged", func(t *testing.T) {
		xsrf := xsrfOf(t, adminC, h.url+"services/gpumem/")
		form := url.Values{"_xsrf": {xsrf}, "action": {"stop"}, "user": {idler.Name}, "server": {""}}
		status, body := post(t, adminC, h.url+"services/gpumem/action", form)
		if status != http.StatusOK || !strings.Contains(html.UnescapeString(body), "Stop "+idler.Name+"'s server "+idler.Name+"/?") {
			t.Fatalf("the stop's confirmation: %d\n%s", status, body)
		}
		if !h.serverRunning(t, idler) {
			t.Fatalf("%s's server stopped before the stop was confirmed", idler.Name)
		}
		form.Set("confirm", "yes")
		status, body = post(t, adminC, h.url+"services/gpumem/action", form)
		if status != http.StatusOK || !regexp.MustCompile(regexp.QuoteMeta(idler.Name+"'s server "+idler.Name+"/ ")+`(stopped|is stopping) \(it held 12\.0 GiB\)`).MatchString(html.UnescapeString(body)) {
			t.Fatalf("after the stop the page says: %d\n%s", status, body)
		}
		testenv.Poll(t, 60*time.Second, idler.Name+"'s server stopped", func() bool { return !h.serverRunning(t, idler) })
		mustLog(t, h.proc.Output(), `gpumem-admin: `+admin+` stopped `+idler.Name+`'s server `+idler.Name+`/ \(held 12884901888 bytes\): the hub answered 20[24]`)
		trainerUnharmed(t, h, trainer, nbT, workerT)
	})
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// adminView is the part of the admin page's api/view the test reads.
type adminView struct {
	Users []struct {
		Name    string        `json:"name"`
		Servers []adminServer `json:"servers"`
	} `json:"users"`
}

type adminServer struct {
	Label     string          `json:"label"`
	Notebooks []adminNotebook `json:"notebooks"`
	Verdict   *struct {
		Rule   string `json:"rule"`
		Reason string `json:"reason"`
	} `json:"verdict"`
}

type adminNotebook struct {
	KernelID string `json:"kernel_id"`
	Bytes    uint64 `json:"bytes"`
	State    string `json:"state"`
}

func (v adminView) server(user string) *adminServer {
	for _, u := range v.Users {
		if u.Name == user && len(u.Servers) == 1 {
			return &u.Servers[0]
		}
	}
	return nil
}

// mismatch says how user's one server differs from one notebook of kernel
// holding bytes, judged state, and the arbiter's rule with a reason that
// holds reason; "" when it does not.
func (v adminView) mismatch(user, kernel string, bytes uint64, state, rule, reason string) string {
	s := v.server(user)
	switch {
	case s == nil:
		return fmt.Sprintf("%s: not one server; ", user)
	case len(s.Notebooks) != 1 || s.Notebooks[0].KernelID != kernel || s.Notebooks[0].Bytes != bytes || s.Notebooks[0].State != state:
		return fmt.Sprintf("%s: notebooks %+v, want kernel %s holding %d, %s; ", user, s.Notebooks, kernel, bytes, state)
	case s.Verdict == nil || s.Verdict.Rule != rule || !strings.Contains(s.Verdict.Reason, reason):
		return fmt.Sprintf("%s: plan %+v, want %s (%s); ", user, s.Verdict, rule, reason)
	}
	return ""
}

// login signs name in at the hub's login form and returns a client that
// keeps its cookies, as a browser would.
func (h *hub) login(t *testing.T, name string) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Jar: jar, Timeout: 60 * time.Second}
	xsrf := xsrfOf(t, c, h.url+"hub/login")
	// next: the hub's home, where nothing is spawned.
	status, body := post(t, c, h.url+"hub/login?next="+url.QueryEscape("/hub/home"), url.Values{"_xsrf": {xsrf}, "username": {name}, "password": {h.password}})
	if status != http.StatusOK {
		t.Fatalf("sign in as %s: %d\n%s", name, status, body)
	}
	return c
}

var xsrfField = regexp.MustCompile(`name="_xsrf" value="([^"]+)"`)

// xsrfOf is the _xsrf form field of the page at u.
func xsrfOf(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	status, body := get(t, c, u)
	m := xsrfField.FindStringSubmatch(body)
	if status != http.StatusOK || m == nil {
		t.Fatalf("GET %s: %d, no _xsrf field\n%s", u, status, body)
	}
	return html.UnescapeString(m[1])
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	return readReply(t, "GET "+u, resp, err)
}

func post(t *testing.T, c *http.Client, u string, form url.Values) (int, string) {
	t.Helper()
	resp, err := c.PostForm(u, form)
	return readReply(t, "POST "+u, resp, err)
}

func readReply(t *testing.T, what string, resp *http.Response, err error) (int, string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return resp.StatusCode, string(b)
}

// killByArgv ends the processes whose argv holds every needle (each pinned
// by a pidfd as its argv is read), and waits (10 s) until they are gone.
func killByArgv(t *testing.T, needles ...string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		match := func(pid int) bool {
			argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil {
				return false
			}
			for _, n := range needles {
				if !strings.Contains(string(argv), n) {
					return false
				}
			}
			return true
		}
		if testenv.KillIf(pid, match) {
			testenv.Poll(t, 10*time.Second, fmt.Sprintf("pid %d ended", pid), func() bool { return !testenv.Alive(pid) })
		}
	}
}

// artifacts is where screenshots go: $GPUMEM_ARTIFACTS, else a temp dir.
func artifacts(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("GPUMEM_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err == nil {
		err = os.WriteFile(to, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}
