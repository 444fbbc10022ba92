package cli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/daemon"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// servedBy adds to a daemon's refusal to start (another daemon holds its
// runtime dir's or its socket's lock) which daemon that is and what to do:
// a new user's second `gpumem serve` most often meets the one JupyterLab's
// extension started, which is to be used, not fought. Other errors pass.
func servedBy(env Env, err error, sock string, runtimeDirs []string) error {
	if err == nil || !(errors.Is(err, daemon.ErrDirTaken) || errors.Is(err, api.ErrServed)) {
		return err
	}
	lines := strings.Split(err.Error(), "\n")
	var holders []string
	seen := map[int]bool{}
	for _, path := range append(append([]string(nil), runtimeDirs...), sock+".lock") {
		pid, ok := lockHolder(env.procRoot(), path)
		if !ok || seen[pid] {
			continue
		}
		seen[pid] = true
		self, parent := holderProcs(env.procFS(), pid)
		holders = append(holders, holderText(pid, self, parent, uint32(os.Geteuid()), sock))
	}
	if len(holders) == 0 {
		holders = append(holders, "which process it is is hidden from this user; `gpumem ls` works with it as it is")
	}
	// On the refusal's own line: JupyterLab's extension reads the last
	// line of a daemon that exited to tell "another daemon won" from a
	// crash (supervision.py's TAKEN_MARK).
	lines[len(lines)-1] += "; " + strings.Join(holders, "; ")
	return &linesError{lines: lines}
}

// lockHolder is the pid holding a flock on path, from <procRoot>/locks
// (the kernel's own record: no process needs to be asked).
func lockHolder(procRoot, path string) (int, bool) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0, false
	}
	data, err := os.ReadFile(filepath.Join(procRoot, "locks"))
	if err != nil {
		return 0, false
	}
	// "1: FLOCK  ADVISORY  WRITE 18340 fe:00:10462682 0 EOF"
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil && pid > 0 {
			return pid, true
		}
	}
	return 0, false
}

// holderProcs reads the holder and its parent; nil for one not readable.
func holderProcs(fs *procs.FS, pid int) (self, parent *procs.Proc) {
	read := func(pid int) *procs.Proc {
		t, err := fs.ReadProcs([]int{pid})
		if err != nil {
			return nil
		}
		if p, ok := t.Get(pid); ok {
			return &p
		}
		return nil
	}
	if self = read(pid); self != nil && self.PPID > 0 {
		parent = read(self.PPID)
	}
	return self, parent
}

// holderText is one sentence on the daemon holding the lock: its pid, its
// user, whether JupyterLab's extension started it (it passes
// --exit-with-parent, and its parent is then a Jupyter server), and what
// to do.
func holderText(pid int, self, parent *procs.Proc, euid uint32, sock string) string {
	if self == nil {
		return fmt.Sprintf("pid %d serves it (its details are hidden from this user); `gpumem ls` works with it as it is", pid)
	}
	who := fmt.Sprintf("pid %d (user %s)", pid, textsafe.Line(orDash(self.User)))
	if fromJupyter(self, parent) {
		server := "its parent"
		if parent != nil {
			server = fmt.Sprintf("its parent, pid %d (%s)", parent.PID, textsafe.Line(procs.CommandLine(parent.Argv, parent.Comm, 60)))
		}
		return fmt.Sprintf("%s serves it, started by JupyterLab's gpumem extension for the Jupyter server that is %s; "+
			"it stops with that server. Use it as it is (gpumem ls, gpumem free), or stop that server first, "+
			"or give this daemon its own --runtime-dir and --socket", who, server)
	}
	cmd := textsafe.Line(procs.CommandLine(self.Argv, self.Comm, 80))
	stop := fmt.Sprintf("stop it first (kill %d)", pid)
	if self.UID != euid && euid != 0 {
		stop = fmt.Sprintf("ask user %s or root to stop it", textsafe.Line(orDash(self.User)))
	}
	return fmt.Sprintf("%s serves it (%s): use it as it is (gpumem ls works with it), %s, "+
		"or give this daemon its own --runtime-dir and --socket (not %s)", who, cmd, stop, textsafe.Line(sock))
}

// fromJupyter reports whether the daemon is one a Jupyter server's
// extension started: the extension passes --exit-with-parent with its
// own pid, so the daemon is that server's child.
func fromJupyter(self, parent *procs.Proc) bool {
	for _, a := range self.Argv {
		name, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "exit-with-parent" && val != "0" && strings.HasPrefix(a, "-") {
			return true
		}
	}
	if parent == nil {
		return false
	}
	return strings.Contains(parent.Comm, "jupyter") || strings.Contains(procs.CommandLine(parent.Argv, parent.Comm, 200), "jupyter")
}
