package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// User is a real system account made for one test (useradd), so that
// multi-user promises are tested across a real uid boundary.
type User struct {
	Name     string
	UID, GID int
	Home     string
}

// RuntimeDir is where the user's Jupyter servers and kernels write their
// files by default.
func (u User) RuntimeDir() string {
	return filepath.Join(u.Home, ".local", "share", "jupyter", "runtime")
}

// MakeUser adds a system user (useradd, with a home) named prefix plus a
// random suffix. It needs root: elsewhere the test fails under CI=true and
// skips otherwise. Cleanup kills every process of that uid (all started by
// this test: the user did not exist before it) and removes the user.
func MakeUser(t testing.TB, prefix string) User {
	t.Helper()
	RequireRoot(t, "this test makes real user accounts (useradd): run it as root")
	name := prefix + RandomHex(3)
	if out, err := accounts("useradd", "--create-home", "--user-group", "--shell", "/bin/bash", name); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	su := User{Name: name, UID: uid, GID: gid, Home: u.HomeDir}
	t.Cleanup(func() {
		deadline := time.Now().Add(15 * time.Second)
		for {
			pids := ProcessesOf(uid)
			if len(pids) == 0 {
				break
			}
			for _, pid := range pids {
				KillIf(pid, func(pid int) bool { return realUID(pid) == uid })
			}
			if time.Now().After(deadline) {
				t.Errorf("processes of %s still alive: %v", name, pids)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if out, err := accounts("userdel", "--remove", name); err != nil {
			t.Logf("userdel %s: %v\n%s", name, err, out)
		}
	})
	return su
}

// accountsMu serialises this process's useradd and userdel, and
// accountsLock (an flock) those of every test process: parallel tests, and
// the packages and stacks go test runs side by side, would otherwise race
// for /etc/passwd's lock, and the loser fails with "cannot lock
// /etc/passwd; try again later".
var accountsMu sync.Mutex

const accountsLock = "/run/lock/gpumem-testenv-accounts"

// accounts runs useradd or userdel (argv) under accountsMu and
// accountsLock (a minute at most: a wait longer than that is a bug).
func accounts(argv ...string) ([]byte, error) {
	accountsMu.Lock()
	defer accountsMu.Unlock()
	if err := os.MkdirAll(filepath.Dir(accountsLock), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(accountsLock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if err != syscall.EWOULDBLOCK || time.Now().After(deadline) {
			return nil, fmt.Errorf("lock %s for %s: %w", accountsLock, argv[0], err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return exec.Command(argv[0], argv[1:]...).CombinedOutput()
}

// TempDir makes a fresh dir in u's home, owned by u (mode 0700); it goes
// with the user.
func (u *User) TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp(u.Home, "gpumem-test-")
	if err != nil {
		t.Fatal(err)
	}
	u.Chown(t, dir)
	return dir
}

// Chown gives path to u; on a nil User it does nothing.
func (u *User) Chown(t testing.TB, path string) {
	t.Helper()
	if u == nil {
		return
	}
	if err := os.Lchown(path, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
}

// ProcessesOf lists the live processes whose real uid is uid.
func ProcessesOf(uid int) []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if pid, err := strconv.Atoi(filepath.Base(d)); err == nil && realUID(pid) == uid && Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// realUID is the real uid of process pid, -1 when it cannot be read.
func realUID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "Uid:" {
			if uid, err := strconv.Atoi(f[1]); err == nil {
				return uid
			}
		}
	}
	return -1
}

// Command is exec.Command(argv...) run as u: its uid and gid, HOME, USER,
// a plain PATH, in u's home, with env added.
func (u User) Command(env []string, argv ...string) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
	cmd.Env = append([]string{"HOME=" + u.Home, "USER=" + u.Name, "PATH=/usr/local/bin:/usr/bin:/bin"}, env...)
	cmd.Dir = u.Home
	return cmd
}

// Run runs argv as u (see Command) and returns its output and exit error.
func (u User) Run(env []string, argv ...string) (stdout, stderr string, err error) {
	cmd := u.Command(env, argv...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// Mkdir makes dir (and its parents) as u: u's own, mode 0700.
func (u User) Mkdir(t testing.TB, dir string) {
	t.Helper()
	if _, stderr, err := u.Run(nil, "mkdir", "-p", "-m", "700", dir); err != nil {
		t.Fatalf("mkdir %s as %s: %v: %s", dir, u.Name, err, stderr)
	}
}

// StartKernel starts `python -m ipykernel_launcher -f connFile` as u, in
// u's home and environment (its dir made as u), and returns once the
// kernel has written the file. The kernel id is the file's name without
// "kernel-" and ".json", as Jupyter names them.
func (u User) StartKernel(t testing.TB, connFile string, extraEnv ...string) *Kernel {
	t.Helper()
	Require(t, "ipykernel")
	u.Mkdir(t, filepath.Dir(connFile))
	env := append([]string{"PYTHONUNBUFFERED=1", "JUPYTER_PLATFORM_DIRS=1", "OMP_NUM_THREADS=1", "PYDEVD_DISABLE_FILE_VALIDATION=1"}, extraEnv...)
	p := StartCmd(t, u.Command(env, Python(), "-m", "ipykernel_launcher", "-f", connFile))
	k := waitKernelFile(t, p, connFile)
	k.Dir = u.Home
	k.ID = strings.TrimSuffix(strings.TrimPrefix(filepath.Base(connFile), "kernel-"), ".json")
	return k
}
