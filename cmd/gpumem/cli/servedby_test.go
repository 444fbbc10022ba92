package cli

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/daemon"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// TestServedByNamesTheHolder: a refusal for a dir another daemon locked
// names the process holding that lock (here this test, which took it),
// its user and what to do; a dir nobody locked names none.
func TestServedByNamesTheHolder(t *testing.T) {
	taken, innocent := t.TempDir(), t.TempDir()
	fd, err := unix.Open(taken, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if pid, ok := lockHolder("/proc", taken); !ok || pid != os.Getpid() {
		t.Fatalf("lockHolder(%s) = %d, %v; want this process, %d", taken, pid, ok, os.Getpid())
	}
	if pid, ok := lockHolder("/proc", innocent); ok {
		t.Fatalf("lockHolder of a dir nobody locked: pid %d", pid)
	}
	me := strconv.Itoa(os.Geteuid())
	if u, err := user.Current(); err == nil {
		me = u.Username
	}
	env := Env{ProcRoot: "/proc"}
	sock := filepath.Join(innocent, "gpumem.sock")
	refusal := fmt.Errorf("runtime dir %s: %w: stop it, or watch other dirs", taken, daemon.ErrDirTaken)
	got := errorText(servedBy(env, refusal, sock, []string{innocent, taken}))
	// One line: the extension tells "another daemon won" by the refusal
	// in the last line a daemon wrote.
	want := fmt.Sprintf("pid %d (user %s) serves it", os.Getpid(), me)
	if !strings.HasPrefix(got, refusal.Error()+"; "+want) || strings.Contains(got, "\n") ||
		!strings.Contains(got, fmt.Sprintf("kill %d", os.Getpid())) {
		t.Errorf("servedBy:\n%s\nwant the refusal, then %q with kill %d, on one line", got, want, os.Getpid())
	}
	// The socket's lock, as api.Listen refuses it.
	if err := os.WriteFile(sock+".lock", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	lf, err := os.Open(sock + ".lock")
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	served := fmt.Errorf("wrapped: %w", api.ErrServed)
	if got := errorText(servedBy(env, served, sock, []string{innocent})); !strings.Contains(got, want) {
		t.Errorf("servedBy of the socket's lock:\n%s\nwant %q", got, want)
	}
	// Any other error passes as it is.
	other := errors.New("listen on x: permission denied")
	if got := servedBy(env, other, sock, []string{taken}); got != other {
		t.Errorf("servedBy(other) = %v", got)
	}
}

// TestHolderText: the extension's daemon (--exit-with-parent, a Jupyter
// server's child) is to be used, not killed; one a user started says
// how to stop it; another user's says whom to ask.
func TestHolderText(t *testing.T) {
	jupyter := &procs.Proc{PID: 700, Comm: "jupyter-lab", Argv: []string{"/usr/bin/python3", "/usr/bin/jupyter-lab"}}
	bash := &procs.Proc{PID: 600, Comm: "bash", Argv: []string{"-bash"}}
	ext := &procs.Proc{PID: 701, PPID: 700, UID: 1000, User: "alice", Argv: []string{"gpumem", "serve", "--exit-with-parent=700", "--socket=/run/user/1000/jupyter/gpumem.sock"}}
	byHand := &procs.Proc{PID: 601, PPID: 600, UID: 1000, User: "alice", Argv: []string{"gpumem", "serve", "--exit-with-parent=0"}}
	bobs := &procs.Proc{PID: 801, PPID: 1, UID: 1001, User: "bob", Argv: []string{"gpumem", "serve"}}
	for _, tc := range []struct {
		name         string
		self, parent *procs.Proc
		want, not    []string
	}{
		{"extension", ext, jupyter, []string{"pid 701 (user alice)", "started by JupyterLab's gpumem extension", "pid 700 (/usr/bin/python3 /usr/bin/jupyter-lab)", "stops with that server", "Use it as it is"}, []string{"kill"}},
		{"extension, its parent unreadable", ext, nil, []string{"started by JupyterLab's gpumem extension", "its parent;"}, []string{"kill"}},
		{"child of a jupyter server", byHand, jupyter, []string{"started by JupyterLab's gpumem extension"}, []string{"kill"}},
		{"by hand", byHand, bash, []string{"pid 601 (user alice) serves it (gpumem serve --exit-with-parent=0)", "kill 601", "--runtime-dir"}, []string{"JupyterLab"}},
		{"another user's", bobs, nil, []string{"pid 801 (user bob)", "ask user bob or root to stop it"}, []string{"kill", "JupyterLab"}},
		{"hidden", nil, nil, []string{"pid 42 serves it (its details are hidden", "gpumem ls"}, []string{"kill"}},
	} {
		pid := 42
		if tc.self != nil {
			pid = tc.self.PID
		}
		got := holderText(pid, tc.self, tc.parent, 1000, "/run/user/1000/jupyter/gpumem.sock")
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(got, n) {
				t.Errorf("%s: %q says %q", tc.name, got, n)
			}
		}
	}
}
