package daemon

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// countingTracker is a procs.Tracker that counts its full reads.
type countingTracker struct {
	*procs.Tracker
	mu   sync.Mutex
	full int
}

func (c *countingTracker) ScanTree(details []int) (*procs.Table, error) {
	c.mu.Lock()
	c.full++
	c.mu.Unlock()
	return c.Tracker.ScanTree(details)
}

func (c *countingTracker) fullReads() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.full
}

// trackedKernels is twoKernels with the daemon sampling through a
// procs.Tracker over the fixture /proc, as `gpumem serve` does.
func trackedKernels(t *testing.T, cfg Config) (*rig, *countingTracker, string) {
	t.Helper()
	r, k1, _ := twoKernelFiles(t, cfg)
	tr := &countingTracker{Tracker: procs.NewTracker(&procs.FS{Root: r.procRoot})}
	t.Cleanup(tr.Close)
	r.d.deps.Procs = tr
	r.d.scan(r.ctx)
	r.d.sample(r.ctx)
	if got := r.report(); !slices.Equal(got["k1"], []int{100, 101, 103, 104}) || !slices.Equal(got["k2"], []int{200, 201}) {
		t.Fatalf("report pids %v", got)
	}
	return r, tr, k1
}

// A child a kernel started since the last sample is recorded in its tree
// at the next sample, and once on the GPU it is the kernel's.
func TestTrackedSampleFindsANewChild(t *testing.T) {
	r, _, k1 := trackedKernels(t, Config{})
	r.setProcs(procstest.Proc{PID: 150, PPID: 101, PGID: 100, SID: 100, Start: 150, Argv: []string{"python", "dataloader"}})
	r.d.sample(r.ctx)
	ks := r.kernel(k1)
	r.d.mu.Lock()
	_, recorded := ks.recorded[procID{150, 150}]
	r.d.mu.Unlock()
	if !recorded {
		t.Errorf("the child started since the last sample is not recorded in k1's tree")
	}
	r.setProcs(procstest.Proc{PID: 151, PPID: 150, PGID: 100, SID: 100, Start: 151, Argv: []string{"python", "on-gpu"}})
	r.setGPU(100, 1<<30, 101, 2<<30, 103, 3<<30, 104, 4<<30, 200, 1<<30, 201, 5<<30, 151, 6<<30)
	r.d.sample(r.ctx)
	if got := r.report()["k1"]; !slices.Contains(got, 151) {
		t.Errorf("k1's pids %v lack its new grandchild on the GPU", got)
	}
}

// Reclaim knows every process of a dead kernel's tree: processes that
// joined it between full reads of /proc (a child that then left its
// session, that child's child, a `nohup … &` job of the kernel's session)
// and left it when the kernel died (reparented to init), idle on the GPU,
// are ended; a new
// process of no kernel, on the GPU too, is not.
func TestTrackedReclaimKnowsTheWholeTree(t *testing.T) {
	r, tr, _ := trackedKernels(t, Config{Reclaim: true})
	r.setProcs(
		procstest.Proc{PID: 150, PPID: 100, PGID: 150, SID: 150, Start: 150, Argv: []string{"python", "own-session"}},
		procstest.Proc{PID: 160, PPID: 1, PGID: 100, SID: 100, Start: 160, Argv: []string{"nohup", "python", "job"}},
		procstest.Proc{PID: 180, PPID: 1, PGID: 180, SID: 180, Start: 180, Argv: []string{"python", "stranger"}},
	)
	r.d.sample(r.ctx)
	r.setProcs(procstest.Proc{PID: 170, PPID: 150, PGID: 150, SID: 150, Start: 170, Argv: []string{"python", "grandchild"}})
	// On the GPU, idle, for the readings that make an orphan idle.
	r.setGPU(100, 1<<30, 150, 1<<30, 160, 1<<30, 170, 1<<30, 180, 1<<30, 200, 1<<30, 201, 5<<30)
	for range 3 {
		r.d.sample(r.ctx)
	}
	full := tr.fullReads()

	// The kernel dies; its children are reparented.
	r.exit(100)
	r.setProcs(
		procstest.Proc{PID: 150, PPID: 1, PGID: 150, SID: 150, Start: 150, Argv: []string{"python", "own-session"}},
		procstest.Proc{PID: 170, PPID: 1, PGID: 150, SID: 150, Start: 170, Argv: []string{"python", "grandchild"}},
	)
	r.setGPU(150, 1<<30, 160, 1<<30, 170, 1<<30, 180, 1<<30, 200, 1<<30, 201, 5<<30)
	if full != 0 {
		t.Fatalf("%d full reads of /proc in the samples before the exit, want none (the tracker's first read was before)", full)
	}
	var fullAtExit int
	r.d.sampling.afterObserve = func() { fullAtExit = tr.fullReads() }
	r.d.sample(r.ctx)
	r.d.sampling.afterObserve = nil
	if fullAtExit == 0 {
		t.Errorf("the exit was judged without a full read of /proc")
	}
	for _, pid := range []string{`"pid":150`, `"pid":160`, `"pid":170`} {
		r.waitLog("orphan ended", pid)
	}
	if got := r.kills(); slices.Contains(got, 180) || slices.Contains(got, 200) || slices.Contains(got, 201) {
		t.Errorf("ended %v: a process of no kernel, or of the live kernel", got)
	}
}

// The sample reads a kernel's tree again only from a new table (the
// tracker hands out the same one while nothing changed): every change of
// the tree still shows in what is recorded for reclaim at the next sample,
// each step after the one before it, and a sample with nothing changed
// reads nothing again.
func TestTrackedSamplesRecordEveryChange(t *testing.T) {
	r, _, k1 := trackedKernels(t, Config{})
	r.d.sample(r.ctx) // the tracker's first incremental read: its own table
	ks := r.kernel(k1)
	recorded := func() (procID, []procID, *procs.Table) {
		r.d.mu.Lock()
		defer r.d.mu.Unlock()
		ids := make([]procID, 0, len(ks.recorded))
		for id := range ks.recorded {
			ids = append(ids, id)
		}
		slices.SortFunc(ids, func(a, b procID) int { return a.PID - b.PID })
		return ks.cur, ids, ks.observedIn
	}
	steps := []struct {
		name   string
		change func()
		cur    procID
		want   []procID
	}{
		{"nothing changed", func() {}, procID{100, 100},
			[]procID{{101, 101}, {102, 102}, {103, 103}, {104, 104}}},
		{"a new child", func() {
			r.setProcs(procstest.Proc{PID: 150, PPID: 101, PGID: 100, SID: 100, Argv: []string{"python", "loader"}})
		}, procID{100, 100}, []procID{{101, 101}, {102, 102}, {103, 103}, {104, 104}, {150, 150}}},
		{"a grandchild in a session of its own", func() {
			r.setProcs(procstest.Proc{PID: 151, PPID: 150, PGID: 151, SID: 151, Argv: []string{"python", "daemonized"}})
		}, procID{100, 100}, []procID{{101, 101}, {102, 102}, {103, 103}, {104, 104}, {150, 150}, {151, 151}}},
		{"a child exits", func() { r.exit(102) }, procID{100, 100},
			[]procID{{101, 101}, {103, 103}, {104, 104}, {150, 150}, {151, 151}}},
		{"a child's pid reused by a process of no kernel", func() {
			r.exit(150)
			r.setProcs(
				procstest.Proc{PID: 151, PPID: 1, PGID: 151, SID: 151, Argv: []string{"python", "daemonized"}},
				procstest.Proc{PID: 150, PPID: 1, PGID: 150, SID: 150, Start: 900, Argv: []string{"python", "stranger"}},
			)
		}, procID{100, 100}, []procID{{101, 101}, {103, 103}, {104, 104}, {151, 151}}},
		{"the kernel process exits", func() { r.exit(100) }, procID{}, []procID{}},
		{"its new process, with a child", func() {
			r.setProcs(
				procstest.Proc{PID: 300, PPID: 1, PGID: 300, SID: 300, Argv: []string{"python", "-m", "ipykernel_launcher", "-f", "k1.json"}},
				procstest.Proc{PID: 301, PPID: 300, PGID: 300, SID: 300, Argv: []string{"python", "worker.py"}},
			)
			r.mu.Lock()
			r.owners[k1] = discovery.Owner{PID: 300, Start: 300, FromPort: true, UIDMatch: true, Proven: true}
			r.mu.Unlock()
			r.d.scan(r.ctx)
			r.d.sample(r.ctx) // the one that takes the new process's tree first
		}, procID{300, 300}, []procID{{301, 301}}},
		{"nothing changed in the new tree", func() {}, procID{300, 300}, []procID{{301, 301}}},
	}
	for _, s := range steps {
		_, _, before := recorded()
		s.change()
		r.d.sample(r.ctx)
		cur, got, after := recorded()
		if cur != s.cur || !slices.Equal(got, s.want) {
			t.Errorf("%s: kernel %v, recorded %v; want %v, %v", s.name, cur, got, s.cur, s.want)
		}
		if strings.HasPrefix(s.name, "nothing changed") && (after == nil || after != before) {
			t.Errorf("%s: the tree was read from another table (%p, before %p): the test no longer covers the shortcut", s.name, after, before)
		}
	}
}
