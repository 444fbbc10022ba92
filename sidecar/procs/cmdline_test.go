package procs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// RecentCmdlines with the allocator (as where Root is its own /proc):
// between listings it reads the pids handed out since the call before, and
// nothing else. Each step changes the fixture /proc and the allocator as a
// host would (or, for the process that appears without a pid handed out,
// as no host does: it shows what was not listed), then checks the argv
// returned. A kernel launched outside the runtime dirs is found from its
// argv at the next call; a thread is no process; a process that exited is
// gone by the next listing; a reused pid's new process is read (the
// allocator went round the ring: a listing).
func TestRecentCmdlinesFromTheAllocator(t *testing.T) {
	root := faultTree(t) // 1, 10, 11
	fs := &FS{Root: root, lookupUser: testUsers}
	clock := time.Unix(1e9, 0)
	fs.now = func() time.Time { return clock }
	alloc := cursor{last: 11, created: 1000, pidMax: 4096, tasks: 3}
	var allocErr error
	fs.argvAlloc = func() (cursor, error) { return alloc, allocErr }
	hand := func(last int) { // tasks handed out up to last (cyclically)
		n := last - alloc.last
		if n <= 0 {
			n += alloc.pidMax - 1
		}
		alloc.created += uint64(n)
		alloc.last = last
	}
	write := func(ps ...procstest.Proc) {
		for _, p := range ps {
			procstest.Replace(t, root, p)
		}
	}
	exit := func(pid int) {
		if err := os.RemoveAll(filepath.Join(root, strconv.Itoa(pid))); err != nil {
			t.Fatal(err)
		}
	}
	launched := []string{"python3", "-m", "ipykernel_launcher", "-f", "/tmp/tmpab12.json"}
	steps := []struct {
		name    string
		change  func()
		advance time.Duration
		want    map[int][]string // pid → argv; nil argv: must be absent
	}{
		{"first call: a listing", func() {}, 0, map[int][]string{
			1: {"init"}, 10: {"python3", "-m", "ipykernel_launcher"}, 11: {"sleep", "900"}}},
		{"a kernel launched with a file of its own", func() {
			write(procstest.Proc{PID: 12, PPID: 1, PGID: 12, SID: 12, Start: 70, Argv: launched})
			hand(12)
		}, 5 * time.Second, map[int][]string{12: launched, 10: {"python3", "-m", "ipykernel_launcher"}}},
		{"a thread of it, and a process that got no pid since (not listed)", func() {
			write(procstest.Proc{PID: 13, PPID: 1, PGID: 12, SID: 12, Start: 71, Tgid: 12, Argv: launched},
				procstest.Proc{PID: 40, PPID: 1, PGID: 40, SID: 40, Start: 72, Argv: []string{"unlisted"}})
			hand(13)
		}, 5 * time.Second, map[int][]string{12: launched, 13: nil, 40: nil}},
		{"the launched kernel exits; a listing at maxAge", func() { exit(12) }, time.Minute,
			map[int][]string{12: nil, 40: {"unlisted"}, 11: {"sleep", "900"}}},
		{"a child's pid handed out again, after the allocator went round", func() {
			exit(11)
			write(procstest.Proc{PID: 11, PPID: 1, PGID: 11, SID: 11, Start: 90, Argv: []string{"reused"}})
			hand(11)
		}, 5 * time.Second, map[int][]string{11: {"reused"}, 12: nil, 40: {"unlisted"}}},
		{"the allocator cannot be read: a listing", func() {
			allocErr = errors.New("no loadavg")
			write(procstest.Proc{PID: 41, PPID: 1, PGID: 41, SID: 41, Start: 95, Argv: []string{"listed"}})
		}, 5 * time.Second, map[int][]string{41: {"listed"}}},
	}
	for _, s := range steps {
		s.change()
		clock = clock.Add(s.advance)
		got, err := fs.RecentCmdlines(time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		for pid, argv := range s.want {
			if a, ok := got[pid]; argv == nil && ok || argv != nil && !slices.Equal(a, argv) {
				t.Errorf("%s: pid %d's argv %q (present %v), want %q", s.name, pid, a, ok, argv)
			}
		}
	}

	// A new pid that cannot be looked at for another reason than its
	// exit fails the call: nothing is taken for absent that was not read.
	allocErr = nil
	fs.RecentCmdlines(time.Minute) // a listing: tracked again
	write(procstest.Proc{PID: 42, PPID: 1, PGID: 42, SID: 42, Start: 96, Argv: launched})
	hand(42)
	fs.fault = func(pid int, file string) error {
		if pid == 42 && file == "status" {
			return syscall.EMFILE
		}
		return nil
	}
	clock = clock.Add(5 * time.Second)
	if _, err := fs.RecentCmdlines(time.Minute); !errors.Is(err, syscall.EMFILE) {
		t.Errorf("a new pid's status unreadable (EMFILE): err %v, want EMFILE", err)
	}
	fs.fault = nil
	clock = clock.Add(5 * time.Second)
	if got, err := fs.RecentCmdlines(time.Minute); err != nil || !slices.Equal(got[42], launched) {
		t.Errorf("after the failure: %v, %v; want 42 read", got[42], err)
	}
}

// A call whose read of a new process's argv fails keeps nothing of what
// it found: the next call lists /proc, and has the process.
func TestRecentCmdlinesFailedCallForgetsTheAllocator(t *testing.T) {
	root := faultTree(t)
	fs := &FS{Root: root, lookupUser: testUsers}
	clock := time.Unix(1e9, 0)
	fs.now = func() time.Time { return clock }
	alloc := cursor{last: 11, created: 1000, pidMax: 4096, tasks: 3}
	fs.argvAlloc = func() (cursor, error) { return alloc, nil }
	if _, err := fs.RecentCmdlines(time.Minute); err != nil {
		t.Fatal(err)
	}
	procstest.WriteTree(t, root, []procstest.Proc{{PID: 12, PPID: 1, PGID: 12, SID: 12, Start: 70, Argv: []string{"new"}}})
	alloc.last, alloc.created = 12, alloc.created+1
	fs.fault = func(pid int, file string) error {
		if pid == 12 && file == "cmdline" {
			return syscall.EMFILE
		}
		return nil
	}
	clock = clock.Add(5 * time.Second)
	if _, err := fs.RecentCmdlines(time.Minute); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("argv unreadable (EMFILE): err %v, want EMFILE", err)
	}
	fs.fault = nil
	clock = clock.Add(5 * time.Second)
	if got, err := fs.RecentCmdlines(time.Minute); err != nil || !slices.Equal(got[12], []string{"new"}) {
		t.Errorf("the call after: 12's argv %q, err %v; want [new]", got[12], err)
	}
}
