package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// reapedEnv marks the child that RunReaped runs the tests in; its value is
// the file where RemoveAfterRun lists dirs.
const reapedEnv = "GPUMEM_TEST_REAPED"

// RunReaped is a TestMain's body that leaves nothing behind, however the
// tests end: it runs run (the tests, m.Run) in a child process, the test
// binary run again with the same arguments, and is itself the child
// subreaper of everything the tests start. When the child exits, even
// SIGKILLed before any t.Cleanup could run, every process the tests left
// (servers, kernels, their workers in sessions of their own, pods' process
// trees) has been reparented to this process, which kills them through
// pidfds, then removes the dirs given to RemoveAfterRun. It returns the
// child's exit status; a child killed by a signal is reported as this
// process killed by that signal, as go test reports a test binary's.
// Signals to this process (an interrupt, go test's timeout) go on to the
// child; the child dies with this process (PR_SET_PDEATHSIG).
func RunReaped(run func() int) int {
	if _, child := os.LookupEnv(reapedEnv); child {
		return run()
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: cannot become the tests' subreaper (%v): running them unguarded\n", err)
		return run()
	}
	dirs, err := os.CreateTemp("", "gpumem-reaped-dirs-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		return 1
	}
	dirs.Close()
	defer os.Remove(dirs.Name())
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), reapedEnv+"="+dirs.Name())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGHUP)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: running the tests: %v\n", err)
		return 1
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var werr error
forward:
	for {
		select {
		case sig := <-sigs:
			// Said, with the time: a signal nobody meant for the tests
			// (a stray SIGTERM, then SIGKILL, from a process that took
			// this one for another) shows in go test's output.
			fmt.Fprintf(os.Stderr, "testenv: %s received %v, passed to the tests\n", time.Now().Format("15:04:05.000"), sig)
			_ = cmd.Process.Signal(sig)
		case werr = <-waited:
			break forward
		}
	}
	signal.Stop(sigs)
	if left := reapOrphans(30 * time.Second); left > 0 {
		fmt.Fprintf(os.Stderr, "testenv: %d processes the tests left could not be ended\n", left)
	}
	removeListed(dirs.Name())
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			signal.Reset(ws.Signal())
			_ = syscall.Kill(os.Getpid(), ws.Signal())
			time.Sleep(time.Second) // the signal's default action ends us
		}
		return ee.ExitCode()
	}
	if werr != nil {
		fmt.Fprintf(os.Stderr, "testenv: the tests: %v\n", werr)
		return 1
	}
	return 0
}

// RemoveAfterRun has RunReaped remove dir, if empty, once the tests have
// ended and their processes are gone: for the dirs a test's own cleanup
// removes, but that a killed test leaves (cgroups it made). Dirs are
// removed the last listed first: list parents before their children.
// Outside RunReaped it does nothing.
func RemoveAfterRun(dir string) {
	list := os.Getenv(reapedEnv)
	if list == "" {
		return
	}
	f, err := os.OpenFile(list, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintln(f, dir)
}

// reapOrphans kills, through pidfds, this process's children (the
// orphans reparented to it, and theirs as they come) and reaps them, until
// none is left or timeout passes; it returns how many are left.
func reapOrphans(timeout time.Duration) int {
	self := os.Getpid()
	deadline := time.Now().Add(timeout)
	for {
		children := childrenOf(self)
		for _, pid := range children {
			KillIf(pid, func(pid int) bool { return parentOf(pid) == self })
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
		if len(children) == 0 {
			if _, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); errors.Is(err, syscall.ECHILD) {
				return 0
			}
		}
		if time.Now().After(deadline) {
			return len(children)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err == nil && parentOf(child) == pid {
			out = append(out, child)
		}
	}
	return out
}

// parentOf is field 4 of /proc/<pid>/stat, -1 when unreadable.
func parentOf(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 {
		return -1
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return ppid
}

// removeListed removes the dirs listed in file, the last listed first.
func removeListed(file string) {
	f, err := os.Open(file)
	if err != nil {
		return
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if d := strings.TrimSpace(sc.Text()); d != "" {
			dirs = append(dirs, d)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Remove(dirs[i])
	}
}
