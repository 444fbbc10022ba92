package hub

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

const gib = 1 << 30

// TestHubAllUsers: JupyterHub spawns alice's and bob's JupyterLab under
// their own uids; one root `gpumem serve --all-users --reclaim-all-users`
// with a shared socket serves both.
//   - alice's kernel, running when the daemon starts, is found; bob logs in
//     later and his kernel is attached within 5 s.
//   - In alice's notebook, %gpumem shows her notebook and bob only as a
//     total; the GPU alert there names users, never bob's notebook.
//   - bob cannot free alice's kernel: not through the API (from his shell
//     or from his own kernel), not through the CLI.
//   - Restarting alice's kernel ends alice's orphan and touches none of
//     bob's processes.
func TestHubAllUsers(t *testing.T) {
	need(t, os.Geteuid() == 0, "the JupyterHub test runs as root (useradd, spawning as other users)")
	testenv.Require(t, "jupyter_client")
	alice, bob := testenv.MakeUser(t, "alice"), testenv.MakeUser(t, "bob")
	h := startHub(t, alice, bob)

	h.startServer(t, alice)
	nbA := h.openNotebook(t, alice, "secret-alice.ipynb")
	orphanA := nbA.childInOwnSession(t)

	// The daemon: root, every user, a socket both users reach.
	sock := sharedSocket(t)
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: nbA.pid, UsedBytes: 30 * gib}, testenv.FakeProc{PID: orphanA, UsedBytes: 6 * gib})
	// --users keeps the daemon to this test's users: other tests' kernels
	// may run on this machine too.
	d := testenv.StartDaemon(t, gpumemBin, t.TempDir(), gpu, "--all-users", "--users="+alice.Name, "--users="+bob.Name, "--reclaim-all-users",
		"--socket="+sock, "--socket-mode=shared", "--interval=500ms")
	d.WaitLog(t, 10*time.Second, "attached", map[string]any{"kernel_id": nbA.kernelID})

	// bob logs in after the daemon started.
	h.startServer(t, bob)
	nbB := h.openNotebook(t, bob, "secret-bob.ipynb")
	fi, err := os.Stat(nbB.connFile)
	if err != nil {
		t.Fatal(err)
	}
	d.WaitLog(t, 15*time.Second, "attached", map[string]any{"kernel_id": nbB.kernelID})
	took := time.Since(fi.ModTime())
	t.Logf("bob's kernel attached %v after its connection file was written", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("bob's kernel attached %v after its connection file appeared, want within 5 s", took)
	}
	childB := nbB.childInOwnSession(t)
	gpu.Set(t, testenv.FakeProc{PID: nbA.pid, UsedBytes: 30 * gib}, testenv.FakeProc{PID: orphanA, UsedBytes: 6 * gib},
		testenv.FakeProc{PID: nbB.pid, UsedBytes: 30 * gib}, testenv.FakeProc{PID: childB, UsedBytes: 2 * gib})

	t.Run("alice sees her notebook and only bob's total", func(t *testing.T) {
		// What the magics ask the daemon, asked from alice's kernel process
		// (the daemon knows its callers by SO_PEERCRED).
		get := fmt.Sprintf(`import http.client, socket
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(%q)
for p in ("/api/v1/kernels/%s", "/api/v1/users", "/api/v1/notebooks"):
    c = C("localhost")
    c.request("GET", p)
    r = c.getresponse()
    print(p, r.status, r.read().decode())
`, sock, nbA.kernelID)
		var own, users, all string
		var printed strings.Builder // all alice's cells printed: the alert shows once, in the first
		testenv.Poll(t, 15*time.Second, "bob's total in /api/v1/users from alice's kernel", func() bool {
			out := nbA.cell(t, get)
			printed.WriteString(out)
			for _, line := range strings.Split(out, "\n") {
				switch {
				case strings.HasPrefix(line, "/api/v1/kernels/"):
					own = line
				case strings.HasPrefix(line, "/api/v1/users "):
					users = line
				case strings.HasPrefix(line, "/api/v1/notebooks "):
					all = line
				}
			}
			return strings.Contains(users, `"user":"`+bob.Name+`"`)
		})
		if !strings.Contains(own, " 200 ") || !strings.Contains(own, "secret-alice.ipynb") {
			t.Errorf("alice's own kernel: %s", own)
		}
		if !strings.Contains(users, `"user":"`+alice.Name+`","notebooks":1`) || !strings.Contains(users, `"user":"`+bob.Name+`","notebooks":1`) {
			t.Errorf("per-user totals: %s", users)
		}
		// Listing notebooks gives alice hers alone (bob's never appear: the
		// leak check below covers this line too).
		if !strings.HasPrefix(all, "/api/v1/notebooks 200") || !strings.Contains(all, "secret-alice.ipynb") {
			t.Errorf("alice's notebooks: %s", all)
		}
		front := testenv.StartFrontend(t, &testenv.Kernel{Dir: t.TempDir(), ConnectionFile: nbA.connFile, ID: nbA.kernelID})
		top := front.Cell(t, "%gpumem top").Text()
		printed.WriteString(top)
		t.Logf("%%gpumem top in alice's notebook:\n%s", top)
		if !strings.Contains(top, "user "+bob.Name+" (1 notebook)") {
			t.Errorf("%%gpumem top does not show bob's total:\n%s", top)
		}
		// A pid is a whole number token, not digits inside a byte count.
		pidRE := func(pid int) *regexp.Regexp { return regexp.MustCompile(fmt.Sprintf(`(^|[^0-9.])%d([^0-9.]|$)`, pid)) }
		leaks := map[string]func(string) bool{
			"secret-bob.ipynb":  func(out string) bool { return strings.Contains(out, "secret-bob.ipynb") },
			nbB.kernelID:        func(out string) bool { return strings.Contains(out, nbB.kernelID) },
			fmt.Sprint(childB):  pidRE(childB).MatchString,
			fmt.Sprint(nbB.pid): pidRE(nbB.pid).MatchString,
		}
		for leak, found := range leaks {
			for what, out := range map[string]string{"own kernel": own, "users": users, "notebooks": all, "%gpumem top": top} {
				if found(out) {
					t.Errorf("alice's %s shows bob's %q: %s", what, leak, out)
				}
			}
		}

		// The GPU is at 85%: alice's next cell printed the alert, naming users.
		var alert string
		testenv.Poll(t, 15*time.Second, "the GPU alert in alice's notebook", func() bool {
			printed.WriteString(front.Cell(t, "pass").Text())
			for _, line := range strings.Split(printed.String(), "\n") {
				// The magics' alert line, not the API's replies printed
				// above (the report holds its alerts too).
				if strings.HasPrefix(strings.TrimSpace(line), "gpumem: GPU") && strings.Contains(line, "% full:") {
					alert = line
				}
			}
			return alert != ""
		})
		t.Logf("alert in alice's notebook: %s", strings.TrimSpace(alert))
		if !strings.Contains(alert, "user "+alice.Name) || !strings.Contains(alert, "user "+bob.Name) {
			t.Errorf("alert does not name both users: %q", alert)
		}
		for _, leak := range []string{"secret-bob.ipynb", "secret-alice.ipynb", "sleep"} {
			if strings.Contains(alert, leak) {
				t.Errorf("alert names %q, want users only: %q", leak, alert)
			}
		}
	})

	t.Run("bob's gpumem ls shows his notebooks only", func(t *testing.T) {
		stdout, stderr, err := asUser(bob, []string{"GPUMEM_SOCKET=" + sock}, gpumemBin, "ls", "--json")
		if err != nil || !strings.Contains(stdout, "secret-bob.ipynb") {
			t.Fatalf("bob: gpumem ls --json: %v\n%s\n%s", err, stdout, stderr)
		}
		for _, leak := range []string{"secret-alice.ipynb", nbA.kernelID} {
			if strings.Contains(stdout, leak) {
				t.Errorf("bob's gpumem ls shows alice's %q:\n%s", leak, stdout)
			}
		}
	})

	t.Run("bob cannot free alice's kernel", func(t *testing.T) {
		env := []string{"GPUMEM_SOCKET=" + sock}
		for _, argv := range [][]string{
			{gpumemBin, "free", nbA.kernelID},
			{gpumemBin, "free", "--all", "--runtime-dir=" + alice.RuntimeDir(), nbA.kernelID},
		} {
			stdout, stderr, err := asUser(bob, env, argv...)
			if err == nil {
				t.Errorf("bob ran %v: it succeeded:\n%s", argv[1:], stdout)
			}
			t.Logf("bob: gpumem %s: %v: %s", strings.Join(argv[1:], " "), err, strings.TrimSpace(stderr))
		}
		// The API itself, from bob's shell and from bob's own kernel.
		post := fmt.Sprintf(`import http.client, socket, sys
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(%q)
c = C("localhost")
c.request("POST", "/api/v1/kernels/%s/free", body="{}", headers={"Content-Type": "application/json"})
r = c.getresponse()
print(r.status, r.read().decode()[:200])
`, sock, nbA.kernelID)
		stdout, stderr, err := asUser(bob, nil, "/usr/bin/python3", "-c", post)
		if err != nil || !strings.HasPrefix(stdout, "403") {
			t.Errorf("POST free of alice's kernel from bob's shell: %v %q %q, want 403", err, stdout, stderr)
		}
		// (The GPU alert may print first: bob's cell is his next one.)
		if out := nbB.cell(t, post); !strings.HasPrefix(out, "403") && !strings.Contains(out, "\n403 ") {
			t.Errorf("POST free of alice's kernel from bob's kernel: %q, want 403", out)
		} else {
			t.Logf("from bob's kernel: %s", strings.TrimSpace(out))
		}
		if m, ok := d.FindLog("free", map[string]any{"kernel_id": nbA.kernelID}); ok {
			t.Errorf("the daemon freed alice's kernel: %v", m)
		}
	})

	t.Run("a connection file bob plants naming alice's kernel proves nothing", func(t *testing.T) {
		raw, err := os.ReadFile(nbA.connFile)
		if err != nil {
			t.Fatal(err)
		}
		var conn map[string]any
		if err := json.Unmarshal(raw, &conn); err != nil {
			t.Fatal(err)
		}
		conn["key"] = testenv.RandomHex(16) // bob does not know alice's key
		planted := filepath.Join(bob.RuntimeDir(), "kernel-planted-by-bob.json")
		b, _ := json.Marshal(conn)
		if err := os.WriteFile(planted, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(planted, bob.UID, bob.GID); err != nil {
			t.Fatal(err)
		}
		// The daemon looks at it (a problem is logged) and never makes it a kernel.
		d.WaitLog(t, 10*time.Second, "discovery", map[string]any{"error": "~kernel-planted-by-bob.json"})
		if m, ok := d.FindLog("attached", map[string]any{"kernel_id": "planted-by-bob"}); ok {
			t.Errorf("the daemon attached to bob's planted file: %v", m)
		}
		for _, nb := range d.Report(t).Notebooks {
			// Listed at most as a file without a process: no pid, no memory.
			if nb.KernelID == "planted-by-bob" && (len(nb.PIDs) > 0 || nb.GPUMemoryBytes > 0) {
				t.Errorf("bob's planted file got alice's kernel's processes: %+v", nb)
			}
			if nb.KernelID == nbA.kernelID && nb.User != alice.Name {
				t.Errorf("alice's kernel now belongs to %s", nb.User)
			}
		}
		m, _ := d.FindLog("discovery", map[string]any{"error": "~kernel-planted-by-bob.json"})
		t.Logf("daemon: %v", m["error"])
	})

	// JupyterHub's idle culler goes by the servers' last_activity: the
	// daemon's polling of a server (GET /api/sessions with the user's
	// token, every rescan) must not count as the user's activity.
	t.Run("the daemon's polling is not activity", func(t *testing.T) {
		status := func() string {
			var st struct {
				LastActivity string `json:"last_activity"`
			}
			h.json(t, http.MethodGet, "user/"+bob.Name+"/api/status", nil, &st) // /api/status is not tracked
			return st.LastActivity
		}
		polls := func() int {
			n := 0
			for _, line := range strings.Split(h.proc.Output(), "\n") {
				if strings.Contains(line, "GET /user/"+bob.Name+"/api/sessions") && strings.Contains(line, "("+bob.Name+"@") {
					n++
				}
			}
			return n
		}
		before, n := status(), polls()
		testenv.Poll(t, 20*time.Second, "three polls of bob's server by the daemon", func() bool { return polls() >= n+3 })
		if after := status(); after != before {
			t.Errorf("bob's server's last_activity moved from %s to %s while only the daemon polled it", before, after)
		}
	})

	t.Run("restarting alice's kernel reclaims only alice's orphan", func(t *testing.T) {
		h.json(t, http.MethodPost, "user/"+alice.Name+"/api/kernels/"+nbA.kernelID+"/restart", nil, nil)
		// The daemon watches the survivors for GPU work for the grace window
		// (--reclaim-grace, 5 s) first.
		testenv.Poll(t, 20*time.Second, "alice's orphan ended", func() bool { return !testenv.Alive(orphanA) })
		d.WaitLog(t, 5*time.Second, "ending orphan that holds GPU memory (SIGTERM)", map[string]any{"pid": orphanA})
		for _, pid := range []int{nbB.pid, childB} {
			if !testenv.Alive(pid) {
				t.Errorf("bob's process %d was ended", pid)
			}
		}
		bobPIDs := testenv.ProcessesOf(bob.UID)
		if out := d.Output(); strings.Contains(out, fmt.Sprintf(`"pid":%d,"argv"`, childB)) {
			t.Errorf("the daemon acted on bob's child %d:\n%s", childB, out)
		}
		t.Logf("bob's processes after alice's restart, all alive: %v", bobPIDs)
	})
}
