package procs

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// countReads counts fs's file reads by file name.
func countReads(fs *FS) (reads func() map[string]int) {
	var mu sync.Mutex
	n := map[string]int{}
	fs.fault = func(_ int, file string) error {
		mu.Lock()
		n[file]++
		mu.Unlock()
		return nil
	}
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := n
		n = map[string]int{}
		return out
	}
}

// ScanLineage attributes the processes asked about as a full scan does:
// for each kernel, the ones of them in its tree (workers, deep chains,
// what is left of a killed kernel's session) are the same; it reads the
// stat of those processes and their ancestors, not every process's.
func TestScanLineageAttributesAsScanTree(t *testing.T) {
	root := t.TempDir()
	fixture, kernels := procstest.Tree(2000, 5)
	// Under each kernel, a child that left for a session of its own (as
	// Ray's workers do) and a chain below it: they are the kernel's through
	// their parents only.
	var leaves []int
	for i, k := range kernels {
		parent := k
		for d := range 5 {
			pid := 100000 + 10*i + d
			fixture = append(fixture, procstest.Proc{PID: pid, PPID: parent, PGID: 100000 + 10*i, SID: 100000 + 10*i,
				UID: 1000, Start: uint64(pid), Comm: "ray"})
			parent = pid
		}
		leaves = append(leaves, parent)
	}
	procstest.WriteTree(t, root, fixture)
	fs := &FS{Root: root, lookupUser: testUsers}
	reads := countReads(fs)
	details := slices.Clone(leaves)
	for i, p := range fixture {
		if i%7 == 0 || slices.Contains(kernels, p.PID) || p.SID == 9999 {
			details = append(details, p.PID)
		}
	}
	full, err := fs.ScanTree(details)
	if err != nil {
		t.Fatal(err)
	}
	reads()
	lin, err := fs.ScanLineage(details)
	if err != nil {
		t.Fatal(err)
	}
	n := reads()
	asked := func(table *Table, kernel int, start uint64) []int {
		var out []int
		for _, p := range table.KernelProcesses(kernel, start) {
			if slices.Contains(details, p.PID) {
				out = append(out, p.PID)
			}
		}
		return out
	}
	for i, k := range append(slices.Clone(kernels), 9999) {
		start := uint64(k)
		want, got := asked(full, k, start), asked(lin, k, start)
		if !slices.Equal(got, want) {
			t.Errorf("kernel %d: lineage gives %v, a full scan %v", k, got, want)
		}
		if i < len(leaves) && !slices.Contains(want, leaves[i]) {
			t.Errorf("kernel %d: the full scan lacks its own-session leaf %d", k, leaves[i])
		}
	}
	for _, d := range details {
		if p, ok := lin.Get(d); !ok || !p.Detailed {
			t.Errorf("%d: %+v, %v; want it read in full", d, p, ok)
		}
	}
	// The asked-for processes and their ancestors (here deep chains of
	// them) only: not the daemons, not init's other children.
	if n["stat"] > len(fixture)/2 || n["status"] > len(details) {
		t.Errorf("%v reads for %d processes asked about, on a host of %d", n, len(details), len(fixture))
	}
}

// A pid that is no pid of this /proc (a nested namespace's) makes
// ScanLineage a full scan, which finds it through NSpid.
func TestScanLineageNestedPID(t *testing.T) {
	root := t.TempDir()
	procstest.WriteTree(t, root, []procstest.Proc{
		{PID: 1, PGID: 1, SID: 1, Start: 1, Comm: "init"},
		{PID: 500, PPID: 1, PGID: 500, SID: 500, Start: 500, NSpid: []int{500, 7}},
	})
	table, err := (&FS{Root: root, lookupUser: testUsers}).ScanLineage([]int{7})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := table.Resolve(7); !ok || p.PID != 500 {
		t.Errorf("7 resolves to %+v, %v; want 500", p, ok)
	}
}

// ReadProcs reads what it is asked for, in full, and nothing else.
func TestReadProcs(t *testing.T) {
	root := faultTree(t)
	fs := &FS{Root: root, lookupUser: testUsers}
	table, err := fs.ReadProcs([]int{11, 10, 11, 404})
	if err != nil {
		t.Fatal(err)
	}
	if got := pidsOf(table.All()); !slices.Equal(got, []int{10, 11}) {
		t.Errorf("read %v, want [10 11]", got)
	}
	if p, _ := table.Get(10); !p.Detailed || p.User != "alice" || p.SessionName != "/nb/a.ipynb" {
		t.Errorf("10 = %+v", p)
	}
}

// RecentCmdlines reads a process's argv once for two calls in a row, the
// argv of new and reused pids at once, and every argv at least every
// maxAge: an argv that changes late in a process's life shows by then.
func TestRecentCmdlines(t *testing.T) {
	root := faultTree(t)
	fs := &FS{Root: root, lookupUser: testUsers}
	reads := countReads(fs)
	clock := time.Unix(1e9, 0)
	fs.now = func() time.Time { return clock }
	call := func() map[int][]string {
		t.Helper()
		out, err := fs.RecentCmdlines(time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := call(); len(got) != 3 || !slices.Equal(got[10], []string{"python3", "-m", "ipykernel_launcher"}) {
		t.Fatalf("first call: %v", got)
	}
	if n := reads()["cmdline"]; n != 3 {
		t.Errorf("first call: %d reads, want 3", n)
	}
	call() // within a second: from memory
	if n := reads()["cmdline"]; n != 0 {
		t.Errorf("a call right after: %d reads", n)
	}
	clock = clock.Add(5 * time.Second)
	call() // read again, the same: confirmed
	reads()
	clock = clock.Add(5 * time.Second)
	procstest.Replace(t, root, procstest.Proc{PID: 11, PPID: 10, PGID: 10, SID: 10, Start: 99, Argv: []string{"reused"}})
	procstest.WriteTree(t, root, []procstest.Proc{{PID: 12, PPID: 10, PGID: 10, SID: 10, Start: 98, Argv: []string{"new"}}})
	got := call()
	if n := reads()["cmdline"]; n != 2 {
		t.Errorf("a reused pid and a new one: %d reads, want 2", n)
	}
	if !slices.Equal(got[11], []string{"reused"}) || !slices.Equal(got[12], []string{"new"}) {
		t.Errorf("got %v", got)
	}
	// Changed in place (an exec): seen within maxAge.
	if err := os.WriteFile(filepath.Join(root, "10", "cmdline"), []byte("exec'd\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(30 * time.Second)
	if got := call(); slices.Equal(got[10], []string{"exec'd"}) {
		t.Logf("seen early") // allowed
	}
	clock = clock.Add(31 * time.Second)
	if got := call(); !slices.Equal(got[10], []string{"exec'd"}) {
		t.Errorf("after maxAge: 10's argv %v, want the new one", got[10])
	}
}
