package tests

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestServerVariants: `gpumem kernels` against every server the stack
// offers (JupyterLab 4 and Notebook 7 on the current stack), each set up as
// real deployments are: under a base_url (JupyterHub gives each user
// /user/<name>/), on a unix socket (ServerApp.sock, jupyter_server only),
// and behind a password, whose info file then holds no usable token.
func TestServerVariants(t *testing.T) {
	t.Parallel()
	for _, kind := range testenv.ServerKinds() {
		t.Run(string(kind)+"/base_url", func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartServerWith(t, kind, testenv.ServerOptions{BaseURL: "/user/alice/"})
			checkNamed(t, srv)
		})
		if kind != testenv.Notebook6 { // Notebook 6 has no unix socket option
			t.Run(string(kind)+"/unix_socket", func(t *testing.T) {
				t.Parallel()
				srv := testenv.StartServerWith(t, kind, testenv.ServerOptions{Sock: true, BaseURL: "/user/alice/"})
				if !strings.HasPrefix(srv.URL, "http+unix://") {
					t.Fatalf("server URL %q: not on a unix socket", srv.URL)
				}
				checkNamed(t, srv)
			})
		}
		t.Run(string(kind)+"/password", func(t *testing.T) {
			t.Parallel()
			testPasswordServer(t, kind)
		})
	}
}

// checkNamed creates a session and checks that gpumem kernels names its
// notebook and server.
func checkNamed(t *testing.T, srv *testenv.Server) {
	t.Helper()
	reap := testenv.NewReaper(t, srv)
	sess := srv.CreateSession(t, "sub dir/train.ipynb")
	cf := srv.ConnectionFile(sess.Kernel.ID)
	pid := testenv.KernelPID(t, cf)
	reap.Add(pid)
	res := runGpumem(t, gpumemEnv(srv.Dir), "kernels", "--json")
	if res.Code != 0 || strings.TrimSpace(res.Stderr) != "" {
		t.Fatalf("gpumem kernels --json: want exit 0 and nothing on stderr\n%s", res)
	}
	got := decodeKernels(t, res)
	k, ok := got[sess.Kernel.ID]
	want := filepath.Join(srv.RootDir, "sub dir", "train.ipynb")
	if !ok || k.Notebook != want || k.ServerURL != srv.URL || k.PID != pid || k.ConnectionFile != cf {
		t.Fatalf("kernel %s = %+v, want notebook %s, server %s, pid %d\n%s", sess.Kernel.ID, k, want, srv.URL, pid, res)
	}
}

// testPasswordServer: the server's file holds no token. gpumem does not ask
// it (no request, so no wait), says so in one line naming the server and
// GPUMEM_SERVER_TOKEN, and names the notebook only from what the kernel
// itself says (JPY_SESSION_NAME, set by jupyter_server 2; Notebook 6 and
// jupyter_server 1 set nothing, and the notebook stays unnamed).
func testPasswordServer(t *testing.T, kind testenv.ServerKind) {
	srv := testenv.StartServerWith(t, kind, testenv.ServerOptions{Password: "s3cret-" + testenv.RandomHex(4)})
	reap := testenv.NewReaper(t, srv)
	sess := srv.CreateSession(t, "nb/secret.ipynb")
	cf := srv.ConnectionFile(sess.Kernel.ID)
	pid := testenv.KernelPID(t, cf)
	reap.Add(pid)

	start := time.Now()
	res := runGpumem(t, gpumemEnv(srv.Dir), "kernels", "--json")
	took := time.Since(start)
	if res.Code != 0 {
		t.Fatalf("gpumem kernels: want exit 0\n%s", res)
	}
	lines := strings.Split(strings.TrimSpace(res.Stderr), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "no usable token") || !strings.Contains(lines[0], "GPUMEM_SERVER_TOKEN") ||
		!strings.Contains(lines[0], srv.URL) {
		t.Errorf("stderr: want one line naming %s, 'no usable token' and GPUMEM_SERVER_TOKEN:\n%s", srv.URL, res.Stderr)
	}
	k, ok := decodeKernels(t, res)[sess.Kernel.ID]
	if !ok || k.PID != pid {
		t.Fatalf("kernel %s = %+v, want it listed with pid %d\n%s", sess.Kernel.ID, k, pid, res)
	}
	want := ""
	if testenv.CurrentStack() != testenv.Debian12 {
		want = filepath.Join(srv.RootDir, "nb", "secret.ipynb") // JPY_SESSION_NAME
	}
	if k.Notebook != want || k.ServerURL != "" {
		t.Errorf("kernel %s: notebook %q server %q, want notebook %q and no server", sess.Kernel.ID, k.Notebook, k.ServerURL, want)
	}
	t.Logf("gpumem kernels beside a password server took %v", took)

	// A wrong token given by the user is said to be the user's.
	res = runGpumem(t, gpumemEnv(srv.Dir, "GPUMEM_SERVER_TOKEN=wrong"), "kernels", "--json")
	if res.Code != 0 || !strings.Contains(res.Stderr, "GPUMEM_SERVER_TOKEN") {
		t.Errorf("with a wrong GPUMEM_SERVER_TOKEN: want exit 0 and a line naming it\n%s", res)
	}
}
