package tests

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestKernels: `gpumem kernels` against each real server of the stack under
// test (Notebook 6 and jupyter_server 1 on Debian 12; JupyterLab 4, Notebook
// 7 and jupyter_server 2 on the current stack), each with sessions in nested folders, a kernel without a
// server sharing the runtime dir, a broken connection file and a stale server
// file whose port nobody listens on. Every live kernel is listed with the
// right notebook, pid, language and server; the broken file and the dead
// server are named on stderr; a kill -9'd kernel is listed as not alive; the
// exit status stays 0 throughout.
func TestKernels(t *testing.T) {
	t.Parallel()
	for _, kind := range testenv.ServerKinds() {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			testKernels(t, kind)
		})
	}
}

func testKernels(t *testing.T, kind testenv.ServerKind) {
	srv := testenv.StartServer(t, kind)
	reap := testenv.NewReaper(t, srv)

	type wantKernel struct {
		notebook, serverURL, connFile string
		pid                           int
	}
	want := map[string]wantKernel{}
	for _, p := range []string{"top.ipynb", "a/b/deep.ipynb", "with space/ü.ipynb"} {
		sess := srv.CreateSession(t, p)
		cf := srv.ConnectionFile(sess.Kernel.ID)
		want[sess.Kernel.ID] = wantKernel{
			notebook:  filepath.Join(srv.RootDir, filepath.FromSlash(p)),
			serverURL: srv.URL,
			connFile:  cf,
		}
	}
	bare := testenv.StartKernel(t, srv.Dir)
	want[bare.ID] = wantKernel{connFile: bare.ConnectionFile, pid: bare.Cmd.Process.Pid}
	// Every kernel's process (testenv.KernelPID also waits until each one listens).
	for id, w := range want {
		pid := testenv.KernelPID(t, w.connFile)
		if w.pid != 0 && pid != w.pid {
			t.Fatalf("bare kernel says pid %d, testenv started %d", pid, w.pid)
		}
		w.pid = pid
		want[id] = w
		if id != bare.ID {
			reap.Add(pid)
		}
	}

	broken := filepath.Join(srv.RuntimeDir(), "kernel-broken.json")
	if err := os.WriteFile(broken, []byte(`{"shell_port": `), 0o600); err != nil {
		t.Fatal(err)
	}
	prefix := kind.InfoPrefix()
	deadURL := "http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) + "/"
	stale := filepath.Join(srv.RuntimeDir(), prefix+"999999.json")
	staleJSON := `{"url":"` + deadURL + `","token":"` + testenv.RandomHex(8) + `","root_dir":"/nowhere","notebook_dir":"/nowhere","pid":999999}`
	if err := os.WriteFile(stale, []byte(staleJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	env := gpumemEnv(srv.Dir)

	res := runGpumem(t, env, "kernels", "--json")
	if res.Code != 0 {
		t.Fatalf("gpumem kernels --json: want exit 0\n%s", res)
	}
	got := decodeKernels(t, res)
	if len(got) != len(want) {
		t.Errorf("listed %d kernels, want %d\n%s", len(got), len(want), res)
	}
	for id, w := range want {
		k, ok := got[id]
		if !ok {
			t.Errorf("kernel %s (%q) not listed\n%s", id, w.notebook, res)
			continue
		}
		if k.Notebook != w.notebook {
			t.Errorf("kernel %s: notebook %q, want %q", id, k.Notebook, w.notebook)
		}
		if k.PID != w.pid {
			t.Errorf("kernel %s (%q): pid %d, the kernel says %d", id, w.notebook, k.PID, w.pid)
		}
		if k.ServerURL != w.serverURL {
			t.Errorf("kernel %s: server_url %q, want %q", id, k.ServerURL, w.serverURL)
		}
		if k.ConnectionFile != w.connFile {
			t.Errorf("kernel %s: connection_file %q, want %q", id, k.ConnectionFile, w.connFile)
		}
		if k.Language != "python" && id != bare.ID {
			t.Errorf("kernel %s: language %q, want \"python\"", id, k.Language)
		}
		if !k.Alive {
			t.Errorf("kernel %s: alive false, want true", id)
		}
	}
	for _, named := range []string{broken, stale} {
		if !strings.Contains(res.Stderr, named) {
			t.Errorf("stderr does not name %s:\n%s", named, res.Stderr)
		}
	}
	if !strings.Contains(res.Stderr, deadURL) {
		t.Errorf("stderr does not name the dead server %s:\n%s", deadURL, res.Stderr)
	}

	t.Run("language of a kernel without a server", func(t *testing.T) {
		// ipykernel rewrites its connection file at start with
		// "kernel_name": "" (measured, ipykernel 6.17), so the kernelspec
		// name is gone for every kernel started without a server.
		if k := got[bare.ID]; k.Language != "python" {
			t.Errorf("kernel %s (no server, %s): language %q, want \"python\": "+
				"cmd/gpumem/cli/kernels.go kernelLanguage gives up when the connection file's kernel_name is empty",
				bare.ID, bare.ConnectionFile, k.Language)
		}
	})

	t.Run("text fits 100 columns", func(t *testing.T) {
		res := runGpumem(t, env, "kernels")
		if res.Code != 0 {
			t.Fatalf("gpumem kernels: want exit 0\n%s", res)
		}
		for _, l := range strings.Split(strings.TrimRight(res.Stdout, "\n"), "\n") {
			if n := len([]rune(l)); n > 100 {
				t.Errorf("a line of %d columns:\n%s", n, res.Stdout)
			}
		}
		for id := range want {
			if !strings.Contains(res.Stdout, "\n"+id[:8]+" ") {
				t.Errorf("no row starts with kernel %s's first 8 characters:\n%s", id, res.Stdout)
			}
		}
	})

	t.Run("text", func(t *testing.T) {
		res := runGpumem(t, env, "kernels", "--wide")
		if res.Code != 0 {
			t.Fatalf("gpumem kernels --wide: want exit 0\n%s", res)
		}
		lines := strings.Split(strings.TrimRight(res.Stdout, "\n"), "\n")
		if len(lines) != 1+len(want) {
			t.Fatalf("want a header and %d rows, got %d lines:\n%s", len(want), len(lines), res.Stdout)
		}
		for _, col := range []string{"KERNEL", "NOTEBOOK", "PID", "ALIVE"} {
			if !strings.Contains(lines[0], col) {
				t.Errorf("header %q lacks %s", lines[0], col)
			}
		}
		for id, w := range want {
			var row string
			for _, l := range lines[1:] {
				if strings.HasPrefix(l, id+" ") {
					row = l
				}
			}
			if row == "" {
				t.Errorf("no row starts with kernel %s:\n%s", id, res.Stdout)
				continue
			}
			if !strings.Contains(row, " "+strconv.Itoa(w.pid)+" ") || (w.notebook != "" && !strings.Contains(row, w.notebook)) {
				t.Errorf("row for %s lacks pid %d or notebook %q: %q", id, w.pid, w.notebook, row)
			}
		}
	})

	t.Run("runtime-dir flag", func(t *testing.T) {
		// The default runtime dir is empty: the kernels come from the flag.
		env := gpumemEnv(srv.Dir, "JUPYTER_RUNTIME_DIR="+t.TempDir())
		res := runGpumem(t, env, "kernels", "--json", "--runtime-dir", srv.RuntimeDir())
		if res.Code != 0 {
			t.Fatalf("want exit 0\n%s", res)
		}
		got := decodeKernels(t, res)
		for id, w := range want {
			if k, ok := got[id]; !ok || k.Notebook != w.notebook || k.PID != w.pid {
				t.Errorf("kernel %s: got %+v, want notebook %q pid %d", id, k, w.notebook, w.pid)
			}
		}
		if len(got) != len(want) {
			t.Errorf("listed %d kernels, want %d", len(got), len(want))
		}
	})

	t.Run("kill -9", func(t *testing.T) {
		// Only the kernel without a server: a server's restarter would
		// replace a killed kernel of its own.
		if err := bare.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Poll(t, 10*time.Second, "the killed kernel to exit", bare.Exited)
		res := runGpumem(t, env, "kernels", "--json")
		if res.Code != 0 {
			t.Fatalf("gpumem kernels --json with a dead kernel: want exit 0\n%s", res)
		}
		got := decodeKernels(t, res)
		for id := range want {
			k, ok := got[id]
			switch {
			case !ok:
				t.Errorf("kernel %s not listed\n%s", id, res)
			case id == bare.ID && k.Alive:
				t.Errorf("killed kernel %s: alive true, want false", id)
			case id == bare.ID && k.PID != 0:
				t.Errorf("killed kernel %s: pid %d, want 0 (no process)", id, k.PID)
			case id != bare.ID && !k.Alive:
				t.Errorf("kernel %s: alive false after another kernel died", id)
			}
		}
		if !strings.Contains(res.Stderr, bare.ConnectionFile) {
			t.Errorf("stderr does not name the dead kernel's file %s:\n%s", bare.ConnectionFile, res.Stderr)
		}
	})
}

// TestKernelsUsageErrors: flags gpumem cannot read are exit status 2, with a
// message, and nothing on stdout.
func TestKernelsUsageErrors(t *testing.T) {
	t.Parallel()
	env := gpumemEnv(t.TempDir())
	for _, args := range [][]string{
		{"kernels", "--bogus"},
		{"kernels", "--json=maybe"},
		{"kernels", "--timeout=soon"},
		{"kernels", "--runtime-dir"},
		{"nosuchcommand"},
	} {
		res := runGpumem(t, env, args...)
		if res.Code != 2 {
			t.Errorf("gpumem %s: want exit 2\n%s", strings.Join(args, " "), res)
		}
		if res.Stderr == "" || res.Stdout != "" {
			t.Errorf("gpumem %s: want a message on stderr only\n%s", strings.Join(args, " "), res)
		}
	}
}
