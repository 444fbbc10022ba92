package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reapedHelper makes this test binary play, instead of running its tests,
// a test binary under RunReaped whose tests start processes (one in a
// session of its own, one double-forked away from its parent) and make a
// dir, print the pids, and then die by SIGKILL before any cleanup.
const reapedHelper = "GPUMEM_TESTENV_REAPED_HELPER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(reapedHelper); dir != "" {
		os.Exit(RunReaped(func() int { return killedTests(dir) }))
	}
	os.Exit(m.Run())
}

func killedTests(dir string) int {
	setsid := exec.Command("sleep", "600")
	setsid.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := setsid.Start(); err != nil {
		fmt.Println(err)
		return 1
	}
	out, err := exec.Command("sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	made := filepath.Join(dir, "made")
	if err := os.Mkdir(made, 0o755); err != nil {
		fmt.Println(err)
		return 1
	}
	RemoveAfterRun(made)
	fmt.Printf("pids %d %s\n", setsid.Process.Pid, strings.TrimSpace(string(out)))
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// A test binary under RunReaped that is SIGKILLed leaves no process and
// no listed dir behind, and is reported killed by SIGKILL.
func TestRunReapedLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), reapedHelper+"="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "pids" {
			for _, s := range f[1:] {
				pid, err := strconv.Atoi(s)
				if err != nil {
					t.Fatal(err)
				}
				pids = append(pids, pid)
			}
		}
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the helper ended with %v, want killed by SIGKILL", err)
	}
	if len(pids) != 2 {
		t.Fatalf("the helper printed pids %v", pids)
	}
	for _, pid := range pids {
		// Gone, not merely a zombie: RunReaped reaped what it killed.
		Poll(t, 10*time.Second, fmt.Sprintf("pid %d to be gone", pid), func() bool {
			_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
			return errors.Is(err, os.ErrNotExist) || !Alive(pid)
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "made")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dir listed for removal is still there: %v", err)
	}
}
