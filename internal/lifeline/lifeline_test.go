package lifeline

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// The helper processes: this test binary run again with a role.
//
//	parent   starts a kernel (sleep KERNEL_SECONDS), then the watcher, then waits to be killed
//	watcher  watches its parent and writes what it sees to REPORT
func TestMain(m *testing.M) {
	switch os.Getenv("LIFELINE_ROLE") {
	case "parent":
		kernel := exec.Command("sleep", os.Getenv("LIFELINE_KERNEL_SECONDS"))
		if err := kernel.Start(); err != nil {
			panic(err)
		}
		w := exec.Command(os.Args[0])
		w.Env = append(os.Environ(), "LIFELINE_ROLE=watcher", "LIFELINE_KERNEL="+strconv.Itoa(kernel.Process.Pid))
		if err := w.Start(); err != nil {
			panic(err)
		}
		select {} // until killed
	case "watcher":
		os.Exit(watcher())
	}
	os.Exit(m.Run())
}

func watcher() int {
	report := os.Getenv("LIFELINE_REPORT")
	say := func(format string, args ...any) {
		f, err := os.OpenFile(report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(f, format+"\n", args...)
		f.Close()
	}
	every, _ := time.ParseDuration(os.Getenv("LIFELINE_EVERY"))
	wait, _ := time.ParseDuration(os.Getenv("LIFELINE_WAIT"))
	var fsys procs.FS
	w, err := Start(context.Background(), Options{Parent: os.Getppid(), Every: every, Children: fsys.ChildrenOf})
	if err != nil {
		say("error %v", err)
		return 1
	}
	// The first look at the children happens before Start returns its
	// goroutine's first wait: poll until the kernel is followed.
	kernel, _ := strconv.Atoi(os.Getenv("LIFELINE_KERNEL"))
	for deadline := time.Now().Add(10 * time.Second); !contains(w.Following(), kernel); {
		if time.Now().After(deadline) {
			say("error the kernel %d is not followed: %v", kernel, w.Following())
			return 1
		}
		time.Sleep(10 * time.Millisecond)
	}
	say("watching %v", w.Following())
	<-w.Gone()
	say("gone %d", time.Now().UnixMilli())
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	left := w.WaitChildren(ctx)
	cancel()
	w.Close()
	say("left %v %d", left, time.Now().UnixMilli())
	return 0
}

func contains(pids []int, pid int) bool {
	for _, p := range pids {
		if p == pid {
			return true
		}
	}
	return false
}

type run struct {
	report string
	parent *exec.Cmd
}

func startParent(t *testing.T, every, wait time.Duration, kernelSeconds int) *run {
	t.Helper()
	r := &run{report: filepath.Join(t.TempDir(), "report")}
	r.parent = exec.Command(os.Args[0])
	r.parent.Env = append(os.Environ(), "LIFELINE_ROLE=parent", "LIFELINE_REPORT="+r.report,
		"LIFELINE_EVERY="+every.String(), "LIFELINE_WAIT="+wait.String(),
		"LIFELINE_KERNEL_SECONDS="+strconv.Itoa(kernelSeconds))
	r.parent.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := r.parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-r.parent.Process.Pid, syscall.SIGKILL)
		_ = r.parent.Wait()
	})
	r.line(t, "watching ")
	return r
}

// line waits for the report's line that starts with prefix and returns
// the rest of it.
func (r *run) line(t *testing.T, prefix string) string {
	t.Helper()
	var rest string
	testenv.Poll(t, 20*time.Second, "the watcher to write "+strings.TrimSpace(prefix), func() bool {
		b, _ := os.ReadFile(r.report)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "error ") {
				t.Fatalf("watcher: %s", l)
			}
			if strings.HasPrefix(l, prefix) {
				rest = strings.TrimPrefix(l, prefix)
				return true
			}
		}
		return false
	})
	return rest
}

// A SIGKILL of the parent is seen through the parent-death signal (the
// periodic check is an hour away), and the parent's other child, still
// running, is waited for: WaitChildren returns only once the test has ended
// that child, after the parent's death was seen. (A kernel that ended by
// itself after a few seconds could end before the kill on a loaded
// machine, and the wait then proved nothing.)
func TestParentKilledSeenAtOnceAndItsChildWaitedFor(t *testing.T) {
	r := startParent(t, time.Hour, 30*time.Second, 60)
	var kernelPID int
	if _, err := fmt.Sscanf(r.line(t, "watching "), "[%d]", &kernelPID); err != nil {
		t.Fatalf("the watcher follows no kernel: %v", err)
	}
	kernel := testenv.Pin(t, kernelPID)
	killed := time.Now()
	if err := r.parent.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ms, _ := strconv.ParseInt(r.line(t, "gone "), 10, 64)
	if d := time.UnixMilli(ms).Sub(killed); d > 2*time.Second {
		t.Errorf("the parent's death was seen after %v, want it at once", d)
	}
	ended := time.Now()
	if !kernel.Signal(syscall.SIGKILL) {
		t.Fatal("the kernel (sleep 60) was gone before the test ended it")
	}
	left := r.line(t, "left ")
	var after int64
	if _, err := fmt.Sscanf(left, "[] %d", &after); err != nil {
		t.Fatalf("left %q: want no child left", left)
	}
	if at := time.UnixMilli(after); at.Before(ended.Truncate(time.Millisecond)) {
		t.Errorf("WaitChildren returned at %v, before the kernel was ended at %v: it did not wait for it", at, ended)
	}
}

// A child that outlives the wait's deadline is named.
func TestWaitChildrenDeadlineNamesTheChild(t *testing.T) {
	r := startParent(t, time.Hour, 300*time.Millisecond, 30)
	watching := r.line(t, "watching ") // [kernel]
	if err := r.parent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	left := r.line(t, "left ")
	if !strings.HasPrefix(left, watching+" ") {
		t.Errorf("left %q, want the kernel %s still running", left, watching)
	}
}

// Start refuses a pid that is not the parent.
func TestStartRefusesANonParent(t *testing.T) {
	if _, err := Start(context.Background(), Options{Parent: os.Getpid()}); err == nil || !strings.Contains(err.Error(), "not this process's parent") {
		t.Fatalf("Start(self) = %v", err)
	}
}

// A hangup while the parent lives (the signal sent by hand, or the forking
// thread of a live parent ending) changes nothing; the watch ends with ctx.
func TestSpuriousSignalWhileTheParentLives(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	w, err := Start(ctx, Options{Parent: os.Getppid(), Every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Gone():
		t.Fatal("Gone after a hangup with the parent alive")
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	w.Close()
	testenv.WaitNoGoroutines(t, 5*time.Second, "lifeline.(*Watch)")
}
