// Package procs owns what gpumem knows about processes: it reads /proc under
// a configurable root (fixture trees in tests) into a Table of pid, parents,
// session, process group, user, start time, argv and JPY_SESSION_NAME, and
// answers "which processes belong to this kernel", including orphans of a
// killed kernel. It also finds who owns a listening TCP port.
//
// Parsing is pure (parse.go) and separate from I/O (scan.go). A process is
// identified by (PID, StartTime): pids are reused. procs never signals or
// changes a process.
//
// PID namespaces. A Table holds the pids of the /proc it was read from.
// NVML reports pids in the caller's namespace (driver 580) or the host's
// (older drivers), and omits processes it cannot see. What works:
//   - gpumem in the kernels' pid namespace (same container, or all on the
//     host): every pid resolves directly.
//   - gpumem in a container with the host's /proc mounted (Root) or with
//     --pid=host: Table.Resolve maps a pid from a nested namespace through
//     the last field of NSpid (ScanTree reads NSpid when a pid does not
//     resolve), and HostToLocal goes the other way.
//   - gpumem in its own pid namespace without the host's /proc: processes of
//     other containers are invisible, and their GPU memory can only be
//     reported as unattributed; run with --pid=host or mount the host's /proc.
//
// TCP ports (ListeningTCPPorts) are those of the reader's network namespace.
package procs

import (
	"cmp"
	"slices"
)

// Proc is one process as read from /proc. PID to Comm come from
// /proc/<pid>/stat and are always set; the fields after Detailed are set
// only when Detailed (FS.ScanTree reads them for the processes asked for).
type Proc struct {
	PID, PPID, PGID, SID int
	// StartTime is field 22 of /proc/<pid>/stat: clock ticks since boot.
	// With PID it identifies the process.
	StartTime uint64
	Comm      string // the kernel's short name (stat field 2)
	// State is stat field 3: 'R', 'S', 'D', … and 'Z' for a zombie (see
	// Exited).
	State byte

	// Detailed is true when status, cmdline and environ were read.
	Detailed bool
	UID      uint32   // effective uid
	User     string   // user name, or the uid in decimal when it has none
	Argv     []string // empty for kernel threads, zombies, and unreadable cmdlines
	// SessionName is JPY_SESSION_NAME from the environment (jupyter_server
	// ≥ 2 sets it to the notebook path), when environ is readable (same user
	// or root).
	SessionName string
	// NSpid lists the pid in each pid namespace from this /proc's down to the
	// process's own (last); one entry when they are the same namespace.
	NSpid []int
}

// Exited reports whether the process has exited and waits only to be
// reaped by its parent (a zombie): it runs nothing and holds nothing but
// its pid, and its children have been reparented already.
func (p Proc) Exited() bool { return p.State == 'Z' || p.State == 'X' }

// Table is a scan of /proc with indexes. It is read-only once built and
// safe for concurrent use.
type Table struct {
	procs    []Proc // sorted by PID
	byPID    map[int]int
	children map[int][]int
	bySID    map[int][]int
	byPGID   map[int][]int
	byNSpid  map[int][]int // innermost pid → indexes, for processes in a nested namespace
}

// NewTable indexes procs (e.g. built by hand in tests). Entries with a
// duplicate PID keep the first.
func NewTable(procs []Proc) *Table {
	t := &Table{
		procs:    slices.Clone(procs),
		byPID:    make(map[int]int, len(procs)),
		children: make(map[int][]int),
		bySID:    make(map[int][]int),
		byPGID:   make(map[int][]int),
		byNSpid:  make(map[int][]int),
	}
	slices.SortStableFunc(t.procs, func(a, b Proc) int { return cmp.Compare(a.PID, b.PID) })
	t.procs = slices.CompactFunc(t.procs, func(a, b Proc) bool { return a.PID == b.PID })
	for i, p := range t.procs {
		t.byPID[p.PID] = i
		t.children[p.PPID] = append(t.children[p.PPID], i)
		t.bySID[p.SID] = append(t.bySID[p.SID], i)
		t.byPGID[p.PGID] = append(t.byPGID[p.PGID], i)
		if n := len(p.NSpid); n > 1 {
			t.byNSpid[p.NSpid[n-1]] = append(t.byNSpid[p.NSpid[n-1]], i)
		}
	}
	return t
}

// Len is the number of processes.
func (t *Table) Len() int { return len(t.procs) }

// All returns every process sorted by PID. The slice is shared: do not modify.
func (t *Table) All() []Proc { return t.procs }

// Get returns the process with pid, whatever its start time.
func (t *Table) Get(pid int) (Proc, bool) {
	i, ok := t.byPID[pid]
	if !ok {
		return Proc{}, false
	}
	return t.procs[i], true
}

// Lookup returns the process (pid, startTime); startTime 0 means unknown and
// matches any. A process with the pid but another start time is a different
// process (the pid was reused) and is not returned.
func (t *Table) Lookup(pid int, startTime uint64) (Proc, bool) {
	p, ok := t.Get(pid)
	if !ok || (startTime != 0 && p.StartTime != startTime) {
		return Proc{}, false
	}
	return p, true
}

// Children returns pid's direct children, sorted by PID.
func (t *Table) Children(pid int) []Proc {
	return t.collect(t.children[pid])
}

func (t *Table) collect(idx []int) []Proc {
	out := make([]Proc, len(idx))
	for i, j := range idx {
		out[i] = t.procs[j]
	}
	return out
}

// KernelProcesses returns the processes that belong to the kernel
// (kernelPID, kernelStart), sorted by PID: the kernel, its descendants, and
// processes still in its session or process group (SID or PGID ==
// kernelPID) with their descendants, even when reparented to init or a
// subreaper — the orphans a killed kernel leaves (jupyter_client makes
// kernels session and group leaders).
//
// kernelStart 0 means unknown. When the pid now belongs to a process with
// another start time, the kernel is gone and the pid reused: the result is
// empty. Nothing is lost by that: Linux frees a pid number only once no
// process uses it as a process group or session id, so a reused kernel pid
// has no orphans left.
//
// A child that left with setsid() and whose kernel died is no longer
// connected to the kernel in /proc; the caller must remember it.
func (t *Table) KernelProcesses(kernelPID int, kernelStart uint64) []Proc {
	if kernelPID <= 0 {
		return nil
	}
	kernel, alive := t.byPID[kernelPID]
	if alive && kernelStart != 0 && t.procs[kernel].StartTime != kernelStart {
		return nil
	}
	// A kernel's tree is a few processes; the table may hold thousands: the
	// set of those found is searched while small, and a map past that.
	var found []int // indexes, in visiting order
	var in map[int]bool
	add := func(i int) {
		switch {
		case in != nil:
			if in[i] {
				return
			}
			in[i] = true
		case slices.Contains(found, i):
			return
		case len(found) == 32:
			in = make(map[int]bool, 64)
			for _, j := range found {
				in[j] = true
			}
			in[i] = true
		}
		found = append(found, i)
	}
	if alive {
		add(kernel)
	}
	for _, members := range [][]int{t.bySID[kernelPID], t.byPGID[kernelPID]} {
		for _, i := range members {
			// Children start after their parent: an older process in the
			// group cannot be the kernel's.
			if kernelStart == 0 || t.procs[i].StartTime >= kernelStart {
				add(i)
			}
		}
	}
	for next := 0; next < len(found); next++ { // breadth-first over children
		for _, c := range t.children[t.procs[found[next]].PID] {
			add(c)
		}
	}
	idx := found
	slices.Sort(idx) // procs is sorted by PID, so indexes sort the same way
	return t.collect(idx)
}

// HostToLocal maps a pid of this table's namespace (the host's, when the
// host's /proc is read) to the pid the process has in its own namespace (the
// last field of NSpid). ok is false for an unknown pid.
func (t *Table) HostToLocal(pid int) (local int, ok bool) {
	p, ok := t.Get(pid)
	if !ok {
		return 0, false
	}
	if len(p.NSpid) == 0 {
		return pid, true
	}
	return p.NSpid[len(p.NSpid)-1], true
}

// LocalToHost maps a pid as seen inside a nested pid namespace (the last
// field of NSpid) to this table's pid. ok is false when no process or
// several (in different namespaces) have that inner pid.
func (t *Table) LocalToHost(inner int) (pid int, ok bool) {
	idx := t.byNSpid[inner]
	if len(idx) != 1 {
		return 0, false
	}
	return t.procs[idx[0]].PID, true
}

// Resolve finds the process a pid from elsewhere (NVML, a kernel's
// connection file) means: this table's pid if there is one, else the only
// process whose innermost pid it is. Old drivers report host pids and new ones
// the caller's namespace's: Resolve covers both when the host's /proc is read.
func (t *Table) Resolve(pid int) (Proc, bool) {
	if p, ok := t.Get(pid); ok {
		return p, true
	}
	if host, ok := t.LocalToHost(pid); ok {
		return t.Get(host)
	}
	return Proc{}, false
}
