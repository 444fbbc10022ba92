package procs

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"os/user"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The real /proc: this test process, a child it starts, and an orphan of a
// process group leader that exited.
func TestRealProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	fs := &FS{}

	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })

	// A group leader that starts a background child and waits for stdin;
	// once stdin closes it exits and the child is reparented, keeping pgid.
	leader := exec.Command("sh", "-c", "sleep 60 & echo $!; read x; exit 0")
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := leader.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := leader.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(orphan, syscall.SIGKILL) })
	t.Cleanup(func() { _ = leader.Process.Kill(); _ = leader.Wait() })

	table, err := fs.Scan()
	if err != nil {
		t.Fatal(err)
	}
	self, ok := table.Get(os.Getpid())
	if !ok {
		t.Fatal("this process is not in the scan")
	}
	if self.PPID != os.Getppid() || self.StartTime == 0 || !reflect.DeepEqual(self.Argv, os.Args) {
		t.Errorf("self = %+v; want ppid %d, argv %q", self, os.Getppid(), os.Args)
	}
	if u, err := user.Current(); err == nil && self.User != u.Username {
		t.Errorf("User = %q, want %q", self.User, u.Username)
	}
	if len(self.NSpid) == 0 || self.NSpid[len(self.NSpid)-1] != os.Getpid() {
		t.Errorf("NSpid = %v", self.NSpid)
	}
	c, ok := table.Lookup(child.Process.Pid, 0)
	if !ok || c.PPID != os.Getpid() || c.Comm != "sleep" || !reflect.DeepEqual(c.Argv, []string{"sleep", "60"}) {
		t.Errorf("child = %+v, %v", c, ok)
	}
	if c.StartTime < self.StartTime {
		t.Errorf("child started (%d) before its parent (%d)", c.StartTime, self.StartTime)
	}
	mine := pidsOf(table.KernelProcesses(self.PID, self.StartTime))
	for _, pid := range []int{self.PID, child.Process.Pid, leader.Process.Pid, orphan} {
		if !slices.Contains(mine, pid) {
			t.Errorf("KernelProcesses(self) = %v lacks %d", mine, pid)
		}
	}
	lead, ok := table.Get(leader.Process.Pid)
	if !ok {
		t.Fatal("leader not scanned")
	}

	// The leader exits; its child is reparented but stays in its group.
	stdin.Close()
	if err := leader.Wait(); err != nil {
		t.Fatalf("leader: %v", err)
	}
	table, err = fs.Scan()
	if err != nil {
		t.Fatal(err)
	}
	o, ok := table.Get(orphan)
	if !ok {
		t.Fatal("orphan not scanned")
	}
	if o.PPID == lead.PID || o.PGID != lead.PID {
		t.Errorf("orphan = %+v: want reparented, pgid %d", o, lead.PID)
	}
	if got := pidsOf(table.KernelProcesses(lead.PID, lead.StartTime)); !reflect.DeepEqual(got, []int{orphan}) {
		t.Errorf("KernelProcesses(dead leader) = %v, want [%d]", got, orphan)
	}
	if _, ok := table.Lookup(lead.PID, lead.StartTime); ok {
		t.Error("dead leader still found")
	}
}

func TestRealListeningSocket(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	fs := &FS{}
	ports, err := fs.ListeningTCPPorts()
	if err != nil {
		t.Fatal(err)
	}
	ls, ok := ports[port]
	if !ok || !ls[0].IP.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Fatalf("port %d not among %d listening ports on 127.0.0.1: %v", port, len(ports), ls)
	}
	inode := ls[0].Inode
	owners, err := fs.SocketOwners([]uint64{inode})
	if err != nil {
		t.Fatal(err)
	}
	if owners[inode] != os.Getpid() {
		t.Errorf("owner of port %d = %d, want %d", port, owners[inode], os.Getpid())
	}
}

// On the real /proc (this process's own), RecentCmdlines' calls after the
// first read the pids handed out since (no listing), and find a process
// started between two calls (once its argv is set).
func TestRealRecentCmdlinesFromTheAllocator(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	fs := &FS{}
	if !fs.ownNamespace() {
		t.Skip("/proc is not this process's own pid namespace's")
	}
	if _, err := fs.RecentCmdlines(time.Minute); err != nil {
		t.Fatal(err)
	}
	listedAt := fs.argvListedAt
	if !fs.argvTracked {
		t.Fatal("the allocator was not read")
	}
	mark := "gpumem-argv-" + strconv.Itoa(os.Getpid())
	child := exec.Command("sh", "-c", "sleep 60; :", mark) // the shell lives on, its argv naming mark
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	// Start returns once the child execs, but its argv may be set a moment
	// later (an empty argv is read again at the next call): poll.
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, err := fs.RecentCmdlines(time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(got[child.Process.Pid], mark) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a process started since the last call: argv %q, want it to name %s", got[child.Process.Pid], mark)
		}
		runtime.Gosched()
	}
	if !fs.argvListedAt.Equal(listedAt) {
		t.Errorf("the call listed /proc: the allocator was not followed")
	}
}
