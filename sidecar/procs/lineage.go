package procs

import (
	"fmt"
	"slices"
	"syscall"
)

// ScanLineage reads the processes details names in full and the stat of
// each one's ancestors, up to init: what attributing those processes needs,
// read in proportion to them rather than to the host. In its table,
// KernelProcesses of a kernel finds every process of details that belongs
// to it (a process belongs to a kernel exactly when it or an ancestor is
// the kernel or in the kernel's session or process group, and those are
// all read), but not the kernel's other processes: use ScanTree where the
// whole tree matters (reclaim). A pid of details that is no pid of this
// /proc (a nested pid namespace's) makes it ScanTree, which looks for it
// through every process's NSpid. Errors are as Scan's.
func (fs *FS) ScanLineage(details []int) (*Table, error) {
	rootfd, err := fs.openRoot()
	if err != nil {
		return nil, err
	}
	defer syscall.Close(rootfd)
	got, err := fs.readPIDs(details)
	if err != nil {
		return nil, err
	}
	byPID := make(map[int]Proc, 4*len(got))
	for _, p := range got {
		byPID[p.PID] = p
	}
	for _, d := range details {
		if _, ok := byPID[d]; !ok && d > 0 {
			return fs.ScanTree(details) // gone since NVML listed it, or another namespace's
		}
	}
	// Up the parent links, one generation of new ancestors at a time (in
	// parallel: a chain is short, the GPU processes many).
	next := parentsToRead(got, byPID)
	buf := make([]byte, 0, 1024)
	for len(next) > 0 {
		var read []Proc
		for _, pid := range next {
			p, ok, b, err := fs.readStat(rootfd, pid, buf)
			buf = b[:0]
			if err != nil {
				return nil, fmt.Errorf("read processes: %w", err)
			}
			if ok {
				byPID[pid] = p
				read = append(read, p)
			}
		}
		next = parentsToRead(read, byPID)
	}
	all := make([]Proc, 0, len(byPID))
	for _, p := range byPID {
		all = append(all, p)
	}
	fs.resolveUsers(all)
	return NewTable(all), nil
}

// parentsToRead are the parents of procs not read yet.
func parentsToRead(procs []Proc, have map[int]Proc) []int {
	var out []int
	for _, p := range procs {
		if _, ok := have[p.PPID]; !ok && p.PPID > 0 && !slices.Contains(out, p.PPID) {
			out = append(out, p.PPID)
		}
	}
	return out
}

// ReadProcs reads the processes pids names, each in full, and nothing
// else: no tree, no process not asked for. A pid that is gone or hidden is
// missing from the table; any other failure is an error, as for Scan.
func (fs *FS) ReadProcs(pids []int) (*Table, error) {
	procs, err := fs.readPIDs(pids)
	if err != nil {
		return nil, err
	}
	fs.resolveUsers(procs)
	return NewTable(procs), nil
}

// readPIDs reads each distinct positive pid of pids in full (readProc),
// a few at a time.
func (fs *FS) readPIDs(pids []int) ([]Proc, error) {
	want := slices.Clone(pids)
	slices.Sort(want)
	want = slices.Compact(want)
	want = slices.DeleteFunc(want, func(pid int) bool { return pid <= 0 })
	procs := make([]Proc, len(want))
	ok := make([]bool, len(want))
	errs := make([]error, len(want))
	parallel(len(want), func(i int, buf []byte) []byte {
		procs[i], ok[i], buf, errs[i] = fs.readProc(want[i], buf)
		return buf
	})
	if err := firstError(errs); err != nil {
		return nil, err
	}
	out := procs[:0]
	for i := range procs {
		if ok[i] {
			out = append(out, procs[i])
		}
	}
	return out, nil
}

// Ancestry reads the stat of pid and of each of its ancestors, up to init
// or maxDepth generations, pid's first: with the stat of a kernel's own
// pid (ReadStats), the table in which KernelProcesses tells whether pid
// belongs to that kernel (see ScanLineage), read in proportion to pid's
// depth, never to the host. A pid that is gone or hidden from us gives
// none; any other failure is an error, as for Scan.
func (fs *FS) Ancestry(pid, maxDepth int) ([]Proc, error) {
	rootfd, err := fs.openRoot()
	if err != nil {
		return nil, err
	}
	defer syscall.Close(rootfd)
	var out []Proc
	buf := make([]byte, 0, 1024)
	for next := pid; next > 0 && len(out) < maxDepth && !slices.ContainsFunc(out, func(p Proc) bool { return p.PID == next }); {
		p, ok, b, err := fs.readStat(rootfd, next, buf)
		buf = b[:0]
		if err != nil {
			return nil, fmt.Errorf("read processes: %w", err)
		}
		if !ok {
			break
		}
		out = append(out, p)
		next = p.PPID
	}
	return out, nil
}

// ReadStats reads the stat of each positive pid of pids, and nothing
// else. A pid that is gone or hidden is missing; any other failure is an
// error, as for Scan.
func (fs *FS) ReadStats(pids []int) ([]Proc, error) {
	rootfd, err := fs.openRoot()
	if err != nil {
		return nil, err
	}
	defer syscall.Close(rootfd)
	var out []Proc
	buf := make([]byte, 0, 1024)
	for _, pid := range pids {
		if pid <= 0 {
			continue
		}
		p, ok, b, err := fs.readStat(rootfd, pid, buf)
		buf = b[:0]
		if err != nil {
			return nil, fmt.Errorf("read processes: %w", err)
		}
		if ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// Ancestry is FS.Ancestry.
func (t *Tracker) Ancestry(pid, maxDepth int) ([]Proc, error) { return t.fs.Ancestry(pid, maxDepth) }

// ReadStats is FS.ReadStats.
func (t *Tracker) ReadStats(pids []int) ([]Proc, error) { return t.fs.ReadStats(pids) }
