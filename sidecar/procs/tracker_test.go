package procs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// trackerRig is a Tracker over a fixture /proc. It learns of new tasks the
// way it would in the mode given: "list" (the pids and their entries'
// inodes, as in a /proc of another pid namespace) or "cursor" (a fake pid
// allocator standing for /proc/loadavg and /proc/stat). Exits are seen by
// reading the tree's processes again (fixture pids are no real processes:
// no pidfds). Every file read is counted.
type trackerRig struct {
	t    *testing.T
	mode string
	root string
	fs   *FS
	tr   *Tracker

	mu     sync.Mutex
	reads  map[string]int // "stat", "status", ...: reads since the last call
	failOn map[int]error  // pid → error its files' reads fail with
	clock  time.Time

	last    int    // the fake allocator's last pid
	created uint64 // tasks created
	pidMax  int
}

func newTrackerRig(t *testing.T, mode string, procs ...procstest.Proc) *trackerRig {
	t.Helper()
	r := &trackerRig{t: t, mode: mode, root: t.TempDir(), reads: map[string]int{}, failOn: map[int]error{},
		clock: time.Unix(1e9, 0), pidMax: 4096}
	procstest.WriteTree(t, r.root, procs)
	for _, p := range procs {
		r.last = max(r.last, p.PID)
	}
	r.fs = &FS{Root: r.root, lookupUser: testUsers}
	r.fs.fault = func(pid int, file string) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.reads[file]++
		return r.failOn[pid]
	}
	r.tr = NewTracker(r.fs)
	if r.tr.own {
		t.Fatal("a fixture tree taken for this process's own /proc")
	}
	r.tr.now = func() time.Time { return r.clock }
	if mode == "cursor" {
		r.tr.own = true
		r.tr.readCursor = func() (cursor, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return cursor{last: r.last, created: r.created, pidMax: r.pidMax, tasks: 100}, nil
		}
		r.tr.probeLimit = 1 << 17
	}
	return r
}

func forModes(t *testing.T, test func(t *testing.T, mode string)) {
	for _, mode := range []string{"list", "cursor"} {
		t.Run(mode, func(t *testing.T) { test(t, mode) })
	}
}

// start starts processes as new tasks: each takes its pid from the
// allocator (the fake one goes past it, wrapping when it is lower) and has
// a /proc entry of its own (a new inode, as for a reused pid).
func (r *trackerRig) start(ps ...procstest.Proc) {
	r.t.Helper()
	for _, p := range ps {
		procstest.Replace(r.t, r.root, p)
		r.mu.Lock()
		r.last = p.PID
		r.created++
		r.mu.Unlock()
	}
}

// rewrite changes a process's files in place: the same process, changed
// (reparented, a zombie).
func (r *trackerRig) rewrite(p procstest.Proc) {
	r.t.Helper()
	dir := filepath.Join(r.root, strconv.Itoa(p.PID))
	for name, content := range map[string]string{"stat": p.StatLine(), "status": p.StatusText()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
}

func (r *trackerRig) exit(pid int) {
	r.t.Helper()
	if err := os.RemoveAll(filepath.Join(r.root, strconv.Itoa(pid))); err != nil {
		r.t.Fatal(err)
	}
}

// scan is one tracked call; it returns the table and the reads it made.
func (r *trackerRig) scan(roots []Root, details ...int) (*Table, map[string]int) {
	r.t.Helper()
	r.mu.Lock()
	r.reads = map[string]int{}
	r.mu.Unlock()
	table, err := r.tr.ScanTrees(roots, details)
	if err != nil {
		r.t.Fatalf("ScanTrees: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	reads := r.reads
	r.reads = map[string]int{}
	return table, reads
}

// host is init, a Jupyter server (5), a kernel (10, started at tick 100:
// a session and group leader) with a worker (11), and a process of no
// kernel (20).
func host() []procstest.Proc {
	return []procstest.Proc{
		{PID: 1, PPID: 0, PGID: 1, SID: 1, Start: 1, Comm: "init", Argv: []string{"/sbin/init"}},
		{PID: 5, PPID: 1, PGID: 5, SID: 5, UID: 1000, Start: 10, Comm: "jupyter", Argv: []string{"jupyter", "lab"}},
		{PID: 10, PPID: 5, PGID: 10, SID: 10, UID: 1000, Start: 100, Comm: "python3", Argv: []string{"python3", "-m", "ipykernel_launcher"}},
		{PID: 11, PPID: 10, PGID: 10, SID: 10, UID: 1000, Start: 110, Comm: "worker"},
		{PID: 20, PPID: 1, PGID: 20, SID: 20, UID: 1001, Start: 50, Comm: "sleep", Argv: []string{"sleep", "1000"}},
	}
}

var kernel10 = []Root{{PID: 10, StartTime: 100}}

func treeOf(table *Table, root Root) []int {
	return pidsOf(table.KernelProcesses(root.PID, root.StartTime))
}

// A child a kernel started since the last call, and its child, are in the
// kernel's tree at the next call, which reads neither init nor the
// process of no kernel.
func TestTrackerNewChildJoinsTree(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		r := newTrackerRig(t, mode, host()...)
		table, _ := r.scan(kernel10, 10)
		if got := treeOf(table, kernel10[0]); !slices.Equal(got, []int{10, 11}) {
			t.Fatalf("tree %v, want [10 11]", got)
		}
		r.start(procstest.Proc{PID: 21, PPID: 10, PGID: 10, SID: 10, Start: 300, Comm: "child"},
			procstest.Proc{PID: 22, PPID: 21, PGID: 10, SID: 10, Start: 310, Comm: "grandchild"})
		table, reads := r.scan(kernel10, 10)
		if got := treeOf(table, kernel10[0]); !slices.Equal(got, []int{10, 11, 21, 22}) {
			t.Errorf("tree %v, want [10 11 21 22]: a new child is missing", got)
		}
		// Read: the tree's processes again (no pidfds here) and the two new
		// ones; not init, the server or the process of no kernel.
		if reads["stat"] > 4 {
			t.Errorf("%d stat reads for a tree of 4", reads["stat"])
		}
		r.start(procstest.Proc{PID: 23, PPID: 22, PGID: 10, SID: 10, UID: 1000, Start: 320, Comm: "great-grandchild"})
		table, _ = r.scan(kernel10, 10)
		if got := treeOf(table, kernel10[0]); !slices.Contains(got, 23) {
			t.Errorf("tree %v lacks 23", got)
		}
		// On a GPU now: asked about, it is read in full.
		table, _ = r.scan(kernel10, 10, 23)
		if p, ok := table.Get(23); !ok || !p.Detailed || p.User != "alice" {
			t.Errorf("23 = %+v, %v: want it read in full", p, ok)
		}
	})
}

// What is left of a kernel's session or process group counts: a process
// started through `nohup … &` (its parent, a shell, gone at once: it is
// init's child, in the kernel's session and group) joins the tree; one in
// the kernel's group only too; a new process of no kernel does not.
func TestTrackerSessionAndGroupJoin(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		r := newTrackerRig(t, mode, host()...)
		r.scan(kernel10, 10)
		r.start(procstest.Proc{PID: 40, PPID: 1, PGID: 10, SID: 10, Start: 400, Comm: "nohup-job"},
			procstest.Proc{PID: 41, PPID: 1, PGID: 10, SID: 5, Start: 410, Comm: "group-only"},
			procstest.Proc{PID: 42, PPID: 1, PGID: 42, SID: 42, Start: 420, Comm: "stranger"},
			procstest.Proc{PID: 43, PPID: 20, PGID: 20, SID: 20, Start: 430, Comm: "strangers-child"})
		table, _ := r.scan(kernel10, 10)
		if got := treeOf(table, kernel10[0]); !slices.Equal(got, []int{10, 11, 40, 41}) {
			t.Errorf("tree %v, want [10 11 40 41]", got)
		}
	})
}

// A process that leaves the tree (setsid, its parent gone: init's child
// in a session of its own) and lives on stays in the table: the daemon
// forgets a process it recorded when the table lacks it.
func TestTrackerKeepsWhatLeftTheTree(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		r := newTrackerRig(t, mode, host()...)
		r.scan(kernel10, 10)
		r.rewrite(procstest.Proc{PID: 11, PPID: 1, PGID: 11, SID: 11, UID: 1000, Start: 110, Comm: "worker"})
		table, _ := r.scan(kernel10, 10)
		if _, ok := table.Lookup(11, 110); !ok {
			t.Errorf("the process that left the tree is missing from the table")
		}
		if got := treeOf(table, kernel10[0]); slices.Contains(got, 11) {
			t.Errorf("tree %v still holds the process that left it", got)
		}
		// A full read keeps it too, for the calls after it.
		r.clock = r.clock.Add(time.Hour)
		r.scan(kernel10, 10)
		table, _ = r.scan(kernel10, 10)
		if _, ok := table.Lookup(11, 110); !ok {
			t.Errorf("after a full read, the process that left the tree is missing")
		}
	})
}

// Pids are reused: a pid of no kernel's process that now names a new
// child of the kernel is in the tree; a tree pid that now names a process
// of no kernel is not; and a process kept that named the old pid as its
// parent is not taken for the new one's child.
func TestTrackerPidReuse(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		procs := append(host(),
			procstest.Proc{PID: 60, PPID: 5, PGID: 60, SID: 60, Start: 600, Comm: "kernel2"},
			procstest.Proc{PID: 12, PPID: 11, PGID: 10, SID: 10, Start: 120, Comm: "workers-child"})
		r := newTrackerRig(t, mode, procs...)
		roots := []Root{{10, 100}, {60, 600}}
		r.scan(roots, 10, 60)

		r.exit(20)
		r.start(procstest.Proc{PID: 20, PPID: 10, PGID: 10, SID: 10, Start: 700, Comm: "child-on-reused-pid"})
		table, _ := r.scan(roots, 10, 60)
		if got := treeOf(table, roots[0]); !slices.Contains(got, 20) {
			t.Errorf("tree %v lacks the child on the reused pid 20", got)
		}

		// 11 exits; its child 12 is reparented to init; pid 11 goes to a
		// child of the other kernel.
		r.exit(11)
		r.rewrite(procstest.Proc{PID: 12, PPID: 1, PGID: 12, SID: 12, Start: 120, Comm: "workers-child"})
		r.start(procstest.Proc{PID: 11, PPID: 60, PGID: 60, SID: 60, Start: 800, Comm: "kernel2-child"})
		table, _ = r.scan(roots, 10, 60)
		if got := treeOf(table, roots[0]); slices.Contains(got, 11) {
			t.Errorf("kernel 10's tree %v holds pid 11, now kernel 60's child", got)
		}
		if got := treeOf(table, roots[1]); !slices.Equal(got, []int{11, 60}) {
			t.Errorf("kernel 60's tree %v, want [11 60]: the old child 12 must not follow pid 11", got)
		}
	})
}

// The pid a process kept names as its parent goes to a new process: the
// kept one was reparented meanwhile, and is not the new one's child, even
// when the process kept is one asked about (a GPU process) and not read
// at every call.
func TestTrackerStaleParentNotAdopted(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		procs := append(host(),
			procstest.Proc{PID: 25, PPID: 1, PGID: 25, SID: 25, Start: 250, Comm: "launcher"},
			procstest.Proc{PID: 26, PPID: 25, PGID: 25, SID: 25, Start: 260, Comm: "gpu-job"})
		r := newTrackerRig(t, mode, procs...)
		r.scan(kernel10, 10, 26)
		r.exit(25)
		r.rewrite(procstest.Proc{PID: 26, PPID: 1, PGID: 25, SID: 25, Start: 260, Comm: "gpu-job"})
		r.start(procstest.Proc{PID: 25, PPID: 10, PGID: 10, SID: 10, Start: 900, Comm: "kernel-child"})
		table, _ := r.scan(kernel10, 10, 26)
		if got := treeOf(table, kernel10[0]); slices.Contains(got, 26) {
			t.Errorf("tree %v holds 26, whose old parent's pid the kernel's new child took", got)
		}
		if p, ok := table.Get(26); !ok || p.PPID != 1 {
			t.Errorf("26 = %+v, %v: want it read again (parent 1)", p, ok)
		}
	})
}

// A pid that names no process of this /proc costs a full read of every
// status once (to look for it in nested pid namespaces), then nothing,
// until a process appears whose innermost pid it is.
func TestTrackerUnseenPidsCostNothing(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		r := newTrackerRig(t, mode, host()...)
		_, reads := r.scan(kernel10, 10, 99999, 88888)
		if reads["status"] < 5 {
			t.Fatalf("first look: %d status reads, want every process's", reads["status"])
		}
		for range 3 {
			table, reads := r.scan(kernel10, 10, 99999, 88888)
			if reads["status"] != 0 || reads["cmdline"] != 0 {
				t.Fatalf("later looks read %v for pids no process has", reads)
			}
			if _, ok := table.Resolve(99999); ok {
				t.Fatal("99999 resolves to a process")
			}
		}
		r.start(procstest.Proc{PID: 70, PPID: 1, PGID: 70, SID: 70, Start: 1000, Comm: "in-a-container", NSpid: []int{70, 99999}},
			procstest.Proc{PID: 88888, PPID: 1, PGID: 88888, SID: 88888, Start: 1010, Comm: "same-pid-here"})
		table, _ := r.scan(kernel10, 10, 99999, 88888)
		if p, ok := table.Resolve(99999); !ok || p.PID != 70 {
			t.Errorf("99999 resolves to %+v, %v; want the process whose innermost pid it is (70)", p, ok)
		}
		if p, ok := table.Resolve(88888); !ok || p.PID != 88888 || !p.Detailed {
			t.Errorf("88888 resolves to %+v, %v; want the new process 88888, read in full", p, ok)
		}
	})
}

// A kernel process that exits is missing from the next table; one that
// is a zombie shows as one.
func TestTrackerKernelExit(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		procs := append(host(), procstest.Proc{PID: 60, PPID: 5, PGID: 60, SID: 60, Start: 600, Comm: "kernel2"})
		r := newTrackerRig(t, mode, procs...)
		roots := []Root{{10, 100}, {60, 600}}
		r.scan(roots, 10, 60)
		r.rewrite(procstest.Proc{PID: 10, PPID: 5, PGID: 10, SID: 10, Start: 100, State: "Z", Comm: "python3"})
		r.exit(60)
		table, _ := r.scan(roots, 10, 60)
		if p, ok := table.Lookup(10, 100); !ok || !p.Exited() {
			t.Errorf("zombie kernel: %+v, %v", p, ok)
		}
		if _, ok := table.Lookup(60, 600); ok {
			t.Errorf("a kernel that exited is in the table")
		}
	})
}

// A read that fails other than as gone or hidden fails the call (a table
// without the process would say it exited); the next call reads all.
func TestTrackerReadErrorFailsTheCall(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		r := newTrackerRig(t, mode, host()...)
		r.scan(kernel10, 10)
		r.start(procstest.Proc{PID: 21, PPID: 10, PGID: 10, SID: 10, Start: 300})
		r.mu.Lock()
		r.failOn[21] = syscall.EMFILE
		r.mu.Unlock()
		if _, err := r.tr.ScanTrees(kernel10, []int{10}); err == nil {
			t.Fatal("a read failing with EMFILE did not fail the call")
		}
		r.mu.Lock()
		delete(r.failOn, 21)
		r.mu.Unlock()
		table, reads := r.scan(kernel10, 10)
		if got := treeOf(table, kernel10[0]); !slices.Contains(got, 21) {
			t.Errorf("tree %v lacks 21 after the failed call", got)
		}
		if reads["stat"] < 6 {
			t.Errorf("after a failed call: %d stat reads, want a full read", reads["stat"])
		}
	})
}

// A call reads in proportion to the kernels' trees and the pids asked
// about, however many other processes the host runs; a full read comes
// every FullEvery, and when a kernel is new.
func TestTrackerReadsInProportion(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		procs := []procstest.Proc{{PID: 1, PGID: 1, SID: 1, Start: 1, Comm: "init"}}
		var roots []Root
		var details []int
		for k := range 20 {
			pid := 1000 + 10*k
			roots = append(roots, Root{pid, uint64(pid)})
			details = append(details, pid, pid+1)
			procs = append(procs, procstest.Proc{PID: pid, PPID: 1, PGID: pid, SID: pid, Start: uint64(pid)},
				procstest.Proc{PID: pid + 1, PPID: pid, PGID: pid, SID: pid, Start: uint64(pid + 1)},
				procstest.Proc{PID: pid + 2, PPID: pid + 1, PGID: pid, SID: pid, Start: uint64(pid + 2)})
		}
		for pid := 5000; pid < 6000; pid++ { // the host's other processes
			procs = append(procs, procstest.Proc{PID: pid, PPID: 1, PGID: pid, SID: pid, Start: uint64(pid)})
		}
		r := newTrackerRig(t, mode, procs...)
		r.tr.FullEvery = time.Minute
		if _, reads := r.scan(roots, details...); reads["stat"] < 1000 {
			t.Fatalf("first call: %d stat reads, want a full read", reads["stat"])
		}
		r.start(procstest.Proc{PID: 6000, PPID: 1000, PGID: 1000, SID: 1000, Start: 9000})
		r.clock = r.clock.Add(30 * time.Second)
		table, reads := r.scan(roots, details...)
		if got := treeOf(table, roots[0]); !slices.Contains(got, 6000) {
			t.Errorf("tree %v lacks the new child", got)
		}
		// 60 tree processes (read again: no pidfds here), one new.
		if reads["stat"] > 61 || reads["status"] > 1 {
			t.Errorf("one call read %v for 20 trees of 3 beside 1,000 other processes", reads)
		}
		r.clock = r.clock.Add(31 * time.Second)
		if _, reads := r.scan(roots, details...); reads["stat"] < 1000 || reads["status"]+reads["cmdline"]+reads["environ"] > 0 {
			t.Errorf("after FullEvery: %v, want a read of every stat and of nothing else", reads)
		}
		more := append(slices.Clone(roots), Root{5000, 5000})
		if _, reads := r.scan(more, details...); reads["stat"] < 1000 {
			t.Errorf("a new kernel: %d stat reads, want a full read", reads["stat"])
		}
	})
}

// The details of a process asked about (argv, user) are read once, and
// again after detailMaxAge: an exec shows by then.
func TestTrackerDetailsExpire(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		r := newTrackerRig(t, mode, host()...)
		r.scan(kernel10, 10, 20)
		if err := os.WriteFile(filepath.Join(r.root, "20", "cmdline"), []byte("python3\x00train.py\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
		r.clock = r.clock.Add(detailMaxAge - time.Minute)
		table, reads := r.scan(kernel10, 10, 20)
		if p, _ := table.Get(20); !slices.Equal(p.Argv, []string{"sleep", "1000"}) || reads["cmdline"] != 0 {
			t.Errorf("before detailMaxAge: argv %q, %d cmdline reads; want the one read first, none", p.Argv, reads["cmdline"])
		}
		r.clock = r.clock.Add(2 * time.Minute)
		table, _ = r.scan(kernel10, 10, 20)
		if p, _ := table.Get(20); !slices.Equal(p.Argv, []string{"python3", "train.py"}) {
			t.Errorf("after detailMaxAge: argv %q, want the new one", p.Argv)
		}
	})
}

// A new kernel is read in full: its children from before are in its tree.
func TestTrackerNewKernelTree(t *testing.T) {
	forModes(t, func(t *testing.T, mode string) {
		procs := append(host(), procstest.Proc{PID: 60, PPID: 5, PGID: 60, SID: 60, Start: 600},
			procstest.Proc{PID: 61, PPID: 60, PGID: 60, SID: 60, Start: 610},
			procstest.Proc{PID: 62, PPID: 1, PGID: 60, SID: 60, Start: 620})
		r := newTrackerRig(t, mode, procs...)
		r.scan(kernel10, 10)
		roots := []Root{{10, 100}, {60, 600}}
		table, _ := r.scan(roots, 10, 60)
		if got := treeOf(table, roots[1]); !slices.Equal(got, []int{60, 61, 62}) {
			t.Errorf("new kernel's tree %v, want [60 61 62]", got)
		}
	})
}

// With the allocator's pids probed, a thread a kernel starts (its pid is
// a task's, /proc/<tid> answers) is no process of the tree; and when the
// allocator cannot be trusted (it went round, or too many new tasks), the
// call reads all.
func TestTrackerCursor(t *testing.T) {
	r := newTrackerRig(t, "cursor", host()...)
	r.scan(kernel10, 10)
	r.start(procstest.Proc{PID: 35, PPID: 5, PGID: 10, SID: 10, Start: 350, Tgid: 10, Comm: "thread"})
	table, _ := r.scan(kernel10, 10)
	if _, ok := table.Get(35); ok {
		t.Errorf("a thread of the kernel is in the table")
	}
	r.start(procstest.Proc{PID: 36, PPID: 10, PGID: 10, SID: 10, Start: 360})
	r.mu.Lock()
	r.created += uint64(r.pidMax) // as if the pids went round
	r.mu.Unlock()
	table, reads := r.scan(kernel10, 10)
	if reads["stat"] < 6 {
		t.Errorf("allocator gone round: %d stat reads, want a full read", reads["stat"])
	}
	if got := treeOf(table, kernel10[0]); !slices.Contains(got, 36) {
		t.Errorf("tree %v lacks 36", got)
	}
	r.tr.probeLimit = 10
	r.start(procstest.Proc{PID: 200, PPID: 10, PGID: 10, SID: 10, Start: 2000}) // 164 pids later
	table, reads = r.scan(kernel10, 10)
	if reads["stat"] < 6 || !slices.Contains(treeOf(table, kernel10[0]), 200) {
		t.Errorf("too many new tasks to probe: %d stat reads, tree %v; want a full read finding 200", reads["stat"], treeOf(table, kernel10[0]))
	}
}

// ScanTree is a full read: every process, the ones asked about in full.
func TestTrackerScanTreeIsFull(t *testing.T) {
	r := newTrackerRig(t, "list", host()...)
	r.scan(kernel10, 10)
	table, err := r.tr.ScanTree([]int{20})
	if err != nil {
		t.Fatal(err)
	}
	if got := pidsOf(table.All()); !slices.Equal(got, []int{1, 5, 10, 11, 20}) {
		t.Errorf("ScanTree: %v, want every process", got)
	}
	if p, _ := table.Get(20); !p.Detailed || p.User != "bob" {
		t.Errorf("20 = %+v, want it read in full", p)
	}
	// The tracked call after it still answers for its own details.
	table, _ = r.scan(kernel10, 10)
	if p, ok := table.Get(10); !ok || !p.Detailed || p.User != "alice" {
		t.Errorf("10 = %+v, %v", p, ok)
	}
}

func TestAllocatedSince(t *testing.T) {
	c := func(last int, created uint64) cursor {
		return cursor{last: last, created: created, pidMax: 32768, tasks: 7000}
	}
	for _, tc := range []struct {
		name      string
		then, now cursor
		want      []pidSpan
		ok        bool
	}{
		{"none", c(500, 10), c(500, 10), nil, true},
		{"in another namespace", c(500, 10), c(500, 14), nil, true},
		{"forward", c(500, 10), c(510, 20), []pidSpan{{501, 510}}, true},
		{"wraps", c(32760, 10), c(310, 20), []pidSpan{{1, 310}, {32761, 32767}}, true},
		{"wraps at the top", c(32767, 10), c(305, 20), []pidSpan{{1, 305}}, true},
		{"may have gone round", c(500, 10), c(510, 10+13000), nil, false},
		{"pid_max changed", c(500, 10), cursor{last: 510, created: 20, pidMax: 65536, tasks: 7000}, nil, false},
		{"counter went back", c(500, 10), c(510, 5), nil, false},
		{"no free pids", cursor{last: 1, pidMax: 100, tasks: 100}, cursor{last: 2, created: 1, pidMax: 100, tasks: 100}, nil, false},
	} {
		got, ok := allocatedSince(tc.then, tc.now)
		if ok != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseLoadavgAndStat(t *testing.T) {
	tasks, last, err := parseLoadavg([]byte("0.52 0.58 0.59 2/871 12345\n"))
	if err != nil || tasks != 871 || last != 12345 {
		t.Errorf("loadavg: %d %d %v", tasks, last, err)
	}
	for _, bad := range []string{"", "0.5 0.5 0.5 2/871", "0.5 0.5 0.5 2871 1", "0.5 0.5 0.5 2/x 1", "0.5 0.5 0.5 2/8 -1"} {
		if _, _, err := parseLoadavg([]byte(bad)); err == nil {
			t.Errorf("loadavg %q: no error", bad)
		}
	}
	n, err := parseCreated([]byte("cpu  1 2 3\nintr 5 0 0\nctxt 99\nbtime 17\nprocesses 551701\nprocs_running 3\n"))
	if err != nil || n != 551701 {
		t.Errorf("stat: %d %v", n, err)
	}
	if _, err := parseCreated([]byte("cpu 1 2 3\n")); err == nil {
		t.Error("stat without processes: no error")
	}
}

func TestParseDirents(t *testing.T) {
	rec := func(ino uint64, name string) []byte {
		n := 19 + len(name) + 1
		n = (n + 7) &^ 7
		b := make([]byte, n)
		for i := range 8 {
			b[i] = byte(ino >> (8 * i))
		}
		b[16], b[17] = byte(n), byte(n>>8)
		copy(b[19:], name)
		return b
	}
	var buf []byte
	for _, r := range [][]byte{rec(7, "."), rec(8, ".."), rec(100, "1"), rec(101, "self"), rec(102, "4242"), rec(103, "sys")} {
		buf = append(buf, r...)
	}
	got := map[int]uint64{}
	if err := parseDirents(buf, got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "map[1:100 4242:102]" {
		t.Errorf("parsed %v", got)
	}
	if err := parseDirents(buf[:10], map[int]uint64{}); err == nil {
		t.Error("a short record: no error")
	}
	bad := rec(1, "12")
	bad[16] = 200
	if err := parseDirents(bad, map[int]uint64{}); err == nil {
		t.Error("a record longer than the buffer: no error")
	}
}
