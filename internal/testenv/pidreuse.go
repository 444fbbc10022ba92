package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
)

// StartAsPid starts argv as process pid, a number no process has now, the
// way pid numbers come back in a long run (pid_max is 32768 on the dev
// machines and CI, and a full test run wraps it): by setting the kernel's
// last allocated pid just below it. A process forking meanwhile may take
// the number first, and so may a thread (this test binary's own runtime
// starts threads at any syscall): it retries while the number is free,
// and returns nil once something holds it, for the caller to pick another
// number. setpgid makes the process lead a group of its own (as servers
// and kernels do). It needs root; the caller ends the process.
func StartAsPid(t testing.TB, pid int, setpgid bool, argv ...string) *exec.Cmd {
	t.Helper()
	RequireRoot(t, "starting a process as a given pid writes /proc/sys/kernel/ns_last_pid")
	for range 100 {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0o644); err != nil {
			t.Fatalf("setting the last pid: %v", err)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: setpgid}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == pid {
			return cmd
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		// /proc/<n> is there for a thread's id too, though not listed.
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Logf("pid %d was taken by another process or thread meanwhile", pid)
			return nil
		}
	}
	t.Fatalf("could not start a process as pid %d in 100 tries", pid)
	return nil
}
