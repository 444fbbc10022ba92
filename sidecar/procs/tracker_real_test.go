package procs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// shellKernel is a real process standing for a kernel: a shell leading a
// session of its own (as jupyter_client starts kernels) that runs the
// lines it is sent, and whose children the test ends through pidfds.
type shellKernel struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	mu    sync.Mutex
	fds   []int // pidfds of what it started
}

func startShellKernel(t *testing.T) *shellKernel {
	t.Helper()
	k := &shellKernel{t: t, cmd: exec.Command("bash", "-c", `while read -r line; do eval "$line"; done`)}
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var err error
	if k.stdin, err = k.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := k.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	k.out = bufio.NewScanner(stdout)
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, fd := range k.fds {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			unix.Close(fd)
		}
		_ = k.cmd.Process.Kill() // our child, not yet waited for: still its pid
		_ = k.cmd.Wait()
	})
	return k
}

// run sends line, which must print one pid, and returns it (a pidfd holds
// it for Cleanup).
func (k *shellKernel) run(line string) int {
	k.t.Helper()
	if _, err := fmt.Fprintln(k.stdin, line); err != nil {
		k.t.Fatal(err)
	}
	if !k.out.Scan() {
		k.t.Fatalf("%q: no pid printed", line)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(k.out.Text()))
	if err != nil {
		k.t.Fatalf("%q printed %q", line, k.out.Text())
	}
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		k.mu.Lock()
		k.fds = append(k.fds, fd)
		k.mu.Unlock()
	}
	return pid
}

func statOf(pid int) (statFields, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return statFields{}, err
	}
	return parseStat(data)
}

func startOf(t *testing.T, pid int) uint64 {
	t.Helper()
	st, err := statOf(pid)
	if err != nil {
		t.Fatalf("pid %d: %v", pid, err)
	}
	return st.StartTime
}

// The real /proc: the Tracker learns of new processes from the pid
// allocator and of exits from pidfds. A child the kernel started a moment
// ago, a child that left its session (setsid) and then its parent, and a
// `nohup … &` job (init's child, in the kernel's session) are each in the
// next table; a call reads a few files, not every process's; the kernel's
// exit shows at the next call.
func TestTrackerRealProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	fs := &FS{}
	var mu sync.Mutex
	reads := 0
	fs.fault = func(int, string) error {
		mu.Lock()
		reads++
		mu.Unlock()
		return nil
	}
	tr := NewTracker(fs)
	t.Cleanup(tr.Close)
	if !tr.own || tr.watch == nil {
		t.Fatalf("this process's /proc is not taken for its own (own %v, pidfds %v): the allocator and pidfds are not used", tr.own, tr.watch != nil)
	}
	k := startShellKernel(t)
	kpid := k.cmd.Process.Pid
	root := []Root{{kpid, startOf(t, kpid)}}
	scan := func() (*Table, int) {
		t.Helper()
		mu.Lock()
		reads = 0
		mu.Unlock()
		table, err := tr.ScanTrees(root, []int{kpid})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return table, reads
	}
	if table, _ := scan(); !slices.Contains(treeOf(table, root[0]), kpid) {
		t.Fatalf("the kernel is not in its own tree")
	}
	if !tr.watch.watched(kpid) {
		t.Errorf("the kernel's exit is not watched through a pidfd")
	}

	child := k.run("sleep 600 & echo $!")
	table, n := scan()
	if !slices.Contains(treeOf(table, root[0]), child) {
		t.Errorf("the child started a moment ago (%d) is not in the kernel's tree %v", child, treeOf(table, root[0]))
	}
	if total := len(mustPIDs(t, fs)); total > 60 && n > total/2 {
		t.Errorf("a call read %d files on a host of %d processes", n, total)
	}

	// In its own session, its parent (a subshell) gone a second later.
	leaver := k.run("( setsid sleep 600 & echo $!; sleep 1 ) &")
	table, _ = scan()
	if !slices.Contains(treeOf(table, root[0]), leaver) {
		t.Errorf("the setsid child (%d), its parent alive, is not in the tree", leaver)
	}
	nohup := k.run("( nohup sleep 600 >/dev/null 2>&1 & echo $! )")
	if !waitFor(5*time.Second, func() bool { p, ok := readPPID(leaver); return ok && p != kpid && !isDescendant(p, kpid) }) {
		t.Fatalf("the setsid child's parent did not exit")
	}
	table, _ = scan()
	if _, ok := table.Get(leaver); !ok {
		t.Errorf("the child that left the tree (%d), alive, is missing from the table", leaver)
	}
	if got := treeOf(table, root[0]); !slices.Contains(got, nohup) {
		t.Errorf("the nohup job (%d, in the kernel's session) is not in the tree %v", nohup, got)
	}

	_ = k.cmd.Process.Kill() // a zombie until waited for
	if !waitFor(5*time.Second, func() bool {
		table, _ := scan()
		p, ok := table.Lookup(root[0].PID, root[0].StartTime)
		return !ok || p.Exited()
	}) {
		t.Errorf("the kernel's exit does not show")
	}
}

func mustPIDs(t *testing.T, fs *FS) []int {
	pids, err := fs.pids()
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

func readPPID(pid int) (int, bool) {
	st, err := statOf(pid)
	return st.PPID, err == nil
}

// isDescendant reports whether pid descends from ancestor now.
func isDescendant(pid, ancestor int) bool {
	for range 64 {
		if pid == ancestor {
			return true
		}
		if pid <= 1 {
			return false
		}
		var ok bool
		if pid, ok = readPPID(pid); !ok {
			return false
		}
	}
	return false
}

// waitFor is testenv.Eventually, which this package's tests cannot import:
// testenv imports procs.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
