package procs

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Root is a kernel process whose tree a Tracker keeps: pids are reused,
// (PID, StartTime) is not. StartTime 0 means unknown.
type Root struct {
	PID       int
	StartTime uint64
}

// Tracker reads /proc for a sampler that asks every second about the same
// kernels: it keeps their trees between calls and reads, per call, what can
// have changed, so that the cost follows the kernels' trees and the pids
// asked about, not every process of the host.
//
// What it keeps, from a full read of every process's stat:
//   - every process of each kernel's tree (Table.KernelProcesses: its
//     descendants and what is left of its session and process group),
//     for as long as it lives, even once it left the tree (setsid, its
//     parent gone): the daemon remembers such processes, and asks for them;
//   - the processes asked about that are on no tree, with their details;
//   - the pids asked about that no process of this /proc has (another pid
//     namespace's): nothing more is read for them until a process appears
//     whose innermost pid (NSpid) they are, or the next full read.
//
// What it reads per call: each new task since the last call (the pids the
// allocator handed out since, from /proc/loadavg: see allocatedSince;
// without that, the list of pids and their /proc entries' inodes), to add
// the processes that join a tree, a child started a moment ago included;
// the tree processes that exited (a pidfd each, polled at once; without
// pidfds, their stat); and the details of pids asked about for the first
// time. It reads every process again every FullEvery, when a kernel is new
// to it, and whenever it cannot tell what changed (the allocator went
// round, too many new tasks, a read it cannot make). Membership of a tree
// grows only by fork: a process cannot join another's session, and a
// parent it is reparented to is its ancestor already.
//
// ScanTree is a full read of every process, as FS.ScanTree: the fresh view
// that confirming an exit and a reclaim need. It also refreshes what the
// Tracker keeps. A Tracker is safe for concurrent use; calls are
// serialised.
type Tracker struct {
	fs *FS
	// FullEvery bounds the time between full reads (0: 30 s).
	FullEvery time.Duration

	mu    sync.Mutex
	now   func() time.Time
	valid bool // a full read was made and everything since was followed
	last  time.Time
	roots map[int]uint64 // root pid → start time

	tree   map[int]Proc // every process ever seen in a root's tree, still believed alive
	others map[int]Proc // detail processes in no tree, read in full
	unseen map[int]bool // detail pids no process of this /proc has
	// detailedAt is when each detail process kept was read in full.
	detailedAt map[int]time.Time
	nspid      map[int]int // innermost pid → pid, for processes in nested pid namespaces; nil until needed

	own    bool           // fs's root is this process's own /proc: cursor and pidfds apply
	cur    cursor         // the allocator at the last read (own only)
	listed map[int]uint64 // without own: pid → inode of its /proc entry at the last read
	watch  *pidWatch

	table   *Table // the last call's answer, while nothing changed
	details []int  // the pids it was asked about then, sorted

	// Test hooks: where new tasks and exits are learnt from (nil: /proc
	// and pidfds, where own).
	readCursor func() (cursor, error)
	probeLimit int // most pids probed per call before a full read instead (0: 1024)
}

// NewTracker returns a Tracker over fs.
func NewTracker(fs *FS) *Tracker {
	t := &Tracker{fs: fs, now: time.Now, own: fs.ownNamespace(), detailedAt: map[int]time.Time{}}
	if t.own {
		t.watch = newPidWatch()
		t.readCursor = fs.readCursor
	}
	return t
}

// Close releases the Tracker's pidfds.
func (t *Tracker) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.watch.close()
	t.watch = nil
}

// Exited is FS.Exited: the targeted look that confirms an exit.
func (t *Tracker) Exited(pid int, start uint64) (bool, error) { return t.fs.Exited(pid, start) }

// ScanTree is FS.ScanTree: every process read now. What the Tracker keeps
// is refreshed from it.
func (t *Tracker) ScanTree(details []int) (*Table, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fullLocked(details, false)
}

// ScanTrees returns a table that holds, as read at this call or kept since
// (see Tracker), every process of the roots' trees (every one that was in
// one and lives) and the processes details names (directly or, for a pid
// of a nested namespace, through NSpid), these in full (Detailed). Other
// processes may be missing: a process absent from it is no proof of
// anything. A root's process that exited is missing from it, or a zombie.
func (t *Tracker) ScanTrees(roots []Root, details []int) (*Table, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	known := true
	want := make(map[int]uint64, len(roots))
	for _, r := range roots {
		if r.PID <= 0 {
			continue
		}
		want[r.PID] = r.StartTime
		if start, ok := t.roots[r.PID]; !ok || start != r.StartTime {
			known = false
		}
	}
	t.roots = want
	every := t.FullEvery
	if every <= 0 {
		every = 30 * time.Second
	}
	if !t.valid || !known {
		return t.fullLocked(details, true)
	}
	table, err := t.incrementalLocked(details, t.now().Sub(t.last) >= every)
	switch {
	case err == errLost:
		return t.fullLocked(details, true)
	case err != nil:
		t.valid = false // what changed meanwhile is not known: read all next time
	}
	return table, err
}

// detailMaxAge is how long a process's details (user, argv, environment)
// are taken as read: they change only at an exec or a setuid.
const detailMaxAge = 5 * time.Minute

// errLost means an incremental read cannot tell what changed: read all.
var errLost = fmt.Errorf("procs: lost track of new tasks")

// fullLocked reads every process (FS.ScanTree) and keeps the trees of the
// roots from it; asked (a tracked call) replaces the detail processes kept
// by details'.
func (t *Tracker) fullLocked(details []int, asked bool) (*Table, error) {
	// The allocator, or the list of pids, before the scan: a process that
	// starts after it is the next call's to find.
	var cur cursor
	var curErr error
	var listed map[int]uint64
	if t.own {
		cur, curErr = t.readCursor()
	} else if listed, curErr = t.fs.listInodes(); curErr != nil {
		t.valid = false
		return nil, curErr
	}
	rootfd, all, err := t.fs.readAll(false)
	if err != nil {
		t.valid = false
		return nil, err
	}
	defer syscall.Close(rootfd)
	if len(details) > 0 {
		if err := t.fs.readDetails(rootfd, all, details); err != nil {
			t.valid = false
			return nil, err
		}
	}
	t.fs.resolveUsers(all)
	table := NewTable(all)
	now := t.now()
	for _, d := range details {
		if p, ok := table.Resolve(d); ok && p.Detailed {
			t.detailedAt[p.PID] = now
		}
	}
	t.absorbLocked(table, details, asked, statusRead(all, table, details))
	t.table = nil
	if asked {
		// From here the next tracked call looks for new tasks. A fresh
		// read for another caller leaves that to the tracked calls: they
		// have not seen the tasks new since the last one (NSpid).
		t.cur, t.listed = cur, listed
		t.valid = curErr == nil
		t.details = sortedCopy(details)
	}
	return table, nil
}

// refreshLocked reads every process's stat, and keeps the roots' trees as
// that shows them (new members; members gone) and the detail processes
// that live on, with their details: the periodic full read of a tracked
// call, which has followed the new tasks and the detail pids itself.
func (t *Tracker) refreshLocked() error {
	rootfd, all, err := t.fs.readAll(false)
	if err != nil {
		return err
	}
	syscall.Close(rootfd)
	t.absorbLocked(NewTable(all), nil, false, false)
	return nil
}

// absorbLocked keeps, from table (a read of every process), the roots'
// trees and what left them alive, and the detail processes: those of
// details when asked (a tracked call's full read), else those kept that
// live on. statusRead says table's processes have their NSpid (every
// status was read): the NSpid index is then built anew.
func (t *Tracker) absorbLocked(table *Table, details []int, asked, statusRead bool) {
	// Details kept from before, for processes not read in full now.
	keep := func(p Proc) Proc {
		if p.Detailed {
			return p
		}
		for _, m := range []map[int]Proc{t.tree, t.others} {
			if old, ok := m[p.PID]; ok && old.Detailed && old.StartTime == p.StartTime {
				return withStat(old, p)
			}
		}
		return p
	}
	tree := make(map[int]Proc, len(t.tree))
	for pid, start := range t.roots {
		for _, p := range table.KernelProcesses(pid, start) {
			tree[p.PID] = keep(p)
		}
	}
	// Processes that left a tree and live on stay: the daemon remembers them.
	for pid, old := range t.tree {
		if p, ok := table.Lookup(pid, old.StartTime); ok {
			if _, in := tree[pid]; !in {
				tree[pid] = keep(p)
			}
		}
	}
	others := map[int]Proc{}
	unseen := map[int]bool{}
	if asked {
		for _, d := range details {
			p, ok := table.Resolve(d)
			switch {
			case !ok:
				unseen[d] = true
			case tree[p.PID].PID == 0:
				others[p.PID] = p
			}
		}
	} else {
		for pid, old := range t.others {
			if p, ok := table.Lookup(pid, old.StartTime); ok {
				others[pid] = keep(p)
			}
		}
	}
	// The NSpid index: rebuilt when every status was read (a detail pid was
	// not a pid of this /proc), else what it held less the processes gone.
	if statusRead {
		t.nspid = map[int]int{}
		for _, p := range table.All() {
			if n := len(p.NSpid); n > 1 {
				t.nspid[p.NSpid[n-1]] = p.PID
			}
		}
	} else {
		for inner, pid := range t.nspid {
			if _, ok := table.Get(pid); !ok {
				delete(t.nspid, inner)
			}
		}
	}
	if !asked {
		for d := range t.unseen {
			if _, ok := table.Get(d); !ok && t.nspid[d] == 0 {
				unseen[d] = true
			}
		}
	}
	for pid := range t.detailedAt {
		if tree[pid].PID == 0 && others[pid].PID == 0 {
			delete(t.detailedAt, pid)
		}
	}
	t.tree, t.others, t.unseen = tree, others, unseen
	t.syncWatchLocked()
	t.last = t.now()
}

// statusRead reports whether FS.ScanTree read every process's status:
// it does when a detail pid is not a pid of the table.
func statusRead(all []Proc, table *Table, details []int) bool {
	for _, d := range details {
		if _, ok := table.Get(d); !ok {
			return len(all) > 0
		}
	}
	return false
}

// withStat is p's details with the stat fields of s (a later read).
func withStat(p, s Proc) Proc {
	p.PPID, p.PGID, p.SID, p.Comm, p.State = s.PPID, s.PGID, s.SID, s.Comm, s.State
	return p
}

// syncWatchLocked watches (pidfd) every tree process, within the budget,
// and no other.
func (t *Tracker) syncWatchLocked() {
	if t.watch == nil {
		return
	}
	for pid := range t.watch.fds {
		if _, ok := t.tree[pid]; !ok {
			t.watch.forget(pid)
		}
	}
	for _, p := range t.tree {
		t.watchLocked(p)
	}
}

// watchLocked watches p's exit, if it is still the process p.
func (t *Tracker) watchLocked(p Proc) {
	t.watch.watch(p.PID, func() bool {
		gone, err := t.fs.Exited(p.PID, p.StartTime)
		return err == nil && !gone
	})
}

// incrementalLocked is ScanTrees from what is kept (see Tracker), with a
// read of every process's stat when refresh is set; errLost when it
// cannot tell what changed. Its phases run in order, each on what the
// ones before left: the exits, the new tasks, the periodic refresh, then
// the processes asked about, looked up in the trees as they now stand.
func (t *Tracker) incrementalLocked(details []int, refresh bool) (*Table, error) {
	rootfd, err := t.fs.openRoot()
	if err != nil {
		return nil, err
	}
	defer syscall.Close(rootfd)
	in := &incremental{t: t, rootfd: rootfd, buf: make([]byte, 0, 4096)}
	if err := in.dropExited(); err != nil {
		return nil, err
	}
	if err := in.takeNewTasks(); err != nil {
		return nil, err
	}
	// Every FullEvery, the trees as a read of every process shows them: the
	// new tasks were followed above, what the allocator cannot say (a
	// checkpoint restored, a process that joined a group) shows here.
	if refresh {
		if err := t.refreshLocked(); err != nil {
			return nil, err
		}
		in.changed = true
	}
	asked, err := in.readDetails(details)
	if err != nil {
		return nil, err
	}
	in.dropUnasked(asked)
	return in.answer(details), nil
}

// incremental is one incrementalLocked call's state, shared by its
// phases: the /proc root every read is made under, one buffer all the
// reads reuse (a call reads hundreds of small files), and whether anything
// kept changed, without which the last call's table is the answer.
type incremental struct {
	t       *Tracker
	rootfd  int
	buf     []byte
	changed bool
}

// restat reads pid's stat again, into the shared buffer.
func (in *incremental) restat(pid int) (Proc, bool, error) {
	p, ok, next, err := in.t.fs.readStat(in.rootfd, pid, in.buf)
	in.buf = next[:0]
	return p, ok, err
}

// dropExited drops the tree processes that exited (the watched ones that
// say so, and every one no pidfd watches) and takes in the stat changes
// of those that live on: their state, parent, session and group are what
// the later phases read. errLost when the pidfds cannot be polled.
func (in *incremental) dropExited() error {
	t := in.t
	exited, err := t.watch.exited()
	if err != nil {
		return errLost
	}
	var check []int
	for _, pid := range exited {
		t.watch.forget(pid)
		check = append(check, pid)
	}
	for pid := range t.tree {
		if !t.watch.watched(pid) {
			check = append(check, pid)
		}
	}
	for _, pid := range check {
		old, ok := t.tree[pid]
		if !ok {
			continue
		}
		p, alive, err := in.restat(pid)
		if err != nil {
			return err
		}
		switch {
		case !alive || p.StartTime != old.StartTime:
			delete(t.tree, pid)
			in.changed = true
		case p.State != old.State || p.PPID != old.PPID || p.SID != old.SID || p.PGID != old.PGID:
			t.tree[pid] = withStat(old, p)
			in.changed = true
		}
	}
	return nil
}

// takeNewTasks takes in each task started since the last call, in the
// order they started: a child after its parent, so that a child finds its
// parent in the tree already.
func (in *incremental) takeNewTasks() error {
	fresh, err := in.t.newTasksLocked(in.rootfd)
	if err != nil {
		return err
	}
	slices.SortFunc(fresh, func(a, b Proc) int { return cmp.Or(cmp.Compare(a.StartTime, b.StartTime), cmp.Compare(a.PID, b.PID)) })
	// Indexed before any new task is taken in: the kept processes as the
	// last call left them are the ones that may name a reused pid.
	childrenOf := in.t.keptChildrenLocked(fresh)
	for _, p := range fresh {
		if err := in.takeNewTask(p, childrenOf[p.PID]); err != nil {
			return err
		}
	}
	return nil
}

// keptChildrenLocked maps each new task's pid to the kept processes that
// name it as their parent. Only new tasks' pids are looked up: the
// thousands of kept processes are not all indexed each call.
func (t *Tracker) keptChildrenLocked(fresh []Proc) map[int][]int {
	if len(fresh) == 0 {
		return nil
	}
	isFresh := make(map[int]bool, len(fresh))
	for _, p := range fresh {
		isFresh[p.PID] = true
	}
	childrenOf := map[int][]int{}
	for _, m := range []map[int]Proc{t.tree, t.others} {
		for pid, p := range m {
			if isFresh[p.PPID] {
				childrenOf[p.PPID] = append(childrenOf[p.PPID], pid)
			}
		}
	}
	return childrenOf
}

// takeNewTask takes in the new task p, whose pid the kept processes
// children name as their parent: what was kept under its pid (a process
// gone, a pid unseen) gives way to it, and it joins a tree when its
// parent, session or group says so.
func (in *incremental) takeNewTask(p Proc, children []int) error {
	t := in.t
	known := false
	if old, ok := t.tree[p.PID]; ok {
		known = old.StartTime == p.StartTime
		if !known { // the pid was reused: the old process is gone
			delete(t.tree, p.PID)
			t.watch.forget(p.PID)
			in.changed = true
		}
	}
	if err := in.rereadReparented(p, children); err != nil {
		return err
	}
	if old, ok := t.others[p.PID]; ok && old.StartTime != p.StartTime {
		delete(t.others, p.PID)
		in.changed = true
	}
	if t.unseen[p.PID] { // a process has that pid now
		delete(t.unseen, p.PID)
		in.changed = true
	}
	joins := !known && t.joinsTreeLocked(p)
	if !joins && t.nspid == nil {
		return nil // its status would say nothing kept needs
	}
	return in.readNewStatus(p, joins)
}

// rereadReparented reads again each kept process of children that names
// the new task p's pid as its parent but started before it: it was the
// child of the pid's former process, reparented since, and must not pass
// for the new one's.
func (in *incremental) rereadReparented(p Proc, children []int) error {
	t := in.t
	for _, cpid := range children {
		for _, m := range []map[int]Proc{t.tree, t.others} {
			c, ok := m[cpid]
			if !ok || c.PPID != p.PID || c.StartTime >= p.StartTime {
				continue
			}
			q, alive, err := in.restat(cpid)
			switch {
			case err != nil:
				return err
			case alive && q.StartTime == c.StartTime:
				m[cpid] = withStat(c, q)
			default:
				delete(m, cpid)
				t.watch.forget(cpid)
			}
			in.changed = true
		}
	}
	return nil
}

// readNewStatus reads the new task p's status, for its NSpid: indexed
// when the NSpid index is kept (an unseen detail pid may be its innermost
// pid), and kept with p when p joins a tree (joins), which it then does.
// A task gone, or a thread, is passed over.
func (in *incremental) readNewStatus(p Proc, joins bool) error {
	t := in.t
	st, tgid, ok, err := t.fs.statusOf(in.rootfd, p.PID, in.buf)
	if err != nil {
		return err
	}
	if !ok || tgid != 0 && tgid != p.PID { // gone, or a thread
		return nil
	}
	if len(st.NSpid) > 1 && t.nspid != nil {
		inner := st.NSpid[len(st.NSpid)-1]
		t.nspid[inner] = p.PID
		if t.unseen[inner] {
			delete(t.unseen, inner)
			in.changed = true
		}
	}
	if joins {
		p.NSpid = st.NSpid
		t.tree[p.PID] = p
		t.watchLocked(p)
		in.changed = true
	}
	return nil
}

// readDetails reads in full the processes asked about (details) the first
// time, and again after detailMaxAge (an exec changes argv, a setuid the
// user). It returns the pids they resolved to, the detail processes to
// keep.
func (in *incremental) readDetails(details []int) (map[int]bool, error) {
	t := in.t
	now := t.now()
	stale := func(pid int) bool { return now.Sub(t.detailedAt[pid]) >= detailMaxAge }
	asked := make(map[int]bool, len(details))
	for _, d := range details {
		pid, found, err := t.resolveLocked(in.rootfd, d)
		if err != nil {
			return nil, err
		}
		if !found {
			continue
		}
		asked[pid] = true
		m := t.tree
		p, ok := t.tree[pid]
		if !ok {
			m = t.others
			p, ok = t.others[pid]
		}
		if ok && p.Detailed && !stale(pid) {
			continue
		}
		full, alive, next, err := t.fs.readProc(pid, in.buf)
		in.buf = next[:0]
		if err != nil {
			return nil, fmt.Errorf("read processes: %w", err)
		}
		switch {
		case alive && (!ok || full.StartTime == p.StartTime):
			m[pid] = full
			t.detailedAt[pid] = now
			in.changed = true
		case ok && p.Detailed:
			t.detailedAt[pid] = now // gone, or reused: the allocator's pids will say
		}
	}
	return asked, nil
}

// dropUnasked drops the detail processes kept in no tree that this call
// did not ask about: a caller asks for what it wants each call.
func (in *incremental) dropUnasked(asked map[int]bool) {
	for pid := range in.t.others {
		if !asked[pid] {
			delete(in.t.others, pid)
			in.changed = true
		}
	}
}

// answer is the table of what is kept: the last call's, when nothing
// changed and the same pids were asked about (the same table tells
// callers, attribution's memo among them, that they may skip their work),
// else one built anew and kept for the next call.
func (in *incremental) answer(details []int) *Table {
	t := in.t
	sorted := sortedCopy(details)
	if !in.changed && t.table != nil && slices.Equal(sorted, t.details) {
		return t.table
	}
	procs := make([]Proc, 0, len(t.tree)+len(t.others))
	for _, p := range t.tree {
		procs = append(procs, p)
	}
	for _, p := range t.others {
		procs = append(procs, p)
	}
	t.fs.resolveUsers(procs)
	t.table, t.details = NewTable(procs), sorted
	return t.table
}

// joinsTreeLocked says whether a new process p belongs to a tree kept: its
// parent is a tree process (which started before it: a parent that started
// later is a reused pid), or its session or process group is a root's.
func (t *Tracker) joinsTreeLocked(p Proc) bool {
	if parent, ok := t.tree[p.PPID]; ok && parent.StartTime <= p.StartTime {
		return true
	}
	for _, leader := range []int{p.SID, p.PGID} {
		if start, ok := t.roots[leader]; ok && p.StartTime >= start {
			return true
		}
	}
	return false
}

// resolveLocked finds the process a detail pid d means (see
// Table.Resolve): a tree or detail process kept, a process of this /proc
// seen for the first time, or one of a nested namespace through NSpid.
// found is false for a pid no process has: it is remembered (unseen),
// and costs nothing more until a process with that innermost pid appears.
func (t *Tracker) resolveLocked(rootfd, d int) (pid int, found bool, err error) {
	if _, ok := t.tree[d]; ok {
		return d, true, nil
	}
	if _, ok := t.others[d]; ok {
		return d, true, nil
	}
	if t.unseen[d] {
		return 0, false, nil
	}
	if host, ok := t.nspid[d]; ok {
		if _, ok := t.tree[host]; ok {
			return host, true, nil
		}
		if _, ok := t.others[host]; ok {
			return host, true, nil
		}
		p, alive, _, err := t.fs.readProc(host, make([]byte, 0, 4096))
		if err != nil {
			return 0, false, fmt.Errorf("read processes: %w", err)
		}
		if alive && len(p.NSpid) > 1 && p.NSpid[len(p.NSpid)-1] == d {
			t.others[host] = p
			return host, true, nil
		}
		delete(t.nspid, d)
	}
	// A process of this /proc not seen before (its pid is older than the
	// last read, or it was not asked about then): not in a tree, or it
	// would be kept.
	if _, ok, _, err := t.fs.readStat(rootfd, d, make([]byte, 0, 1024)); err != nil {
		return 0, false, fmt.Errorf("read processes: %w", err)
	} else if ok {
		return d, true, nil
	}
	if t.nspid == nil {
		if t.nspid, err = t.fs.nspidIndex(rootfd); err != nil {
			t.nspid = nil
			return 0, false, err
		}
		if _, ok := t.nspid[d]; ok {
			return t.resolveLocked(rootfd, d)
		}
	}
	t.unseen[d] = true
	return 0, false, nil
}

// newTasksLocked reads the stat of each task started since the last call
// (processes, and threads where the allocator's pids are probed). errLost
// when that cannot be known.
func (t *Tracker) newTasksLocked(rootfd int) ([]Proc, error) {
	if t.own {
		cur, err := t.readCursor()
		if err != nil {
			return nil, errLost
		}
		spans, ok := allocatedSince(t.cur, cur)
		limit := t.probeLimit
		if limit <= 0 {
			limit = 1024
		}
		if !ok || spanLen(spans) > limit {
			return nil, errLost
		}
		fresh, err := t.fs.probe(rootfd, spans)
		if err != nil {
			return nil, err
		}
		t.cur = cur
		return fresh, nil
	}
	listed, err := t.fs.listInodes()
	if err != nil {
		return nil, err
	}
	var fresh []Proc
	buf := make([]byte, 0, 1024)
	for pid, ino := range listed {
		if old, ok := t.listed[pid]; ok && old == ino {
			continue
		}
		p, ok, next, err := t.fs.readStat(rootfd, pid, buf)
		buf = next[:0]
		if err != nil {
			return nil, fmt.Errorf("read processes: %w", err)
		}
		if ok {
			fresh = append(fresh, p)
		}
	}
	t.listed = listed
	return fresh, nil
}

func sortedCopy(v []int) []int {
	s := slices.Clone(v)
	slices.Sort(s)
	return s
}
