package procs

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"
)

// Cmdlines reads the argv of every process (one read each, nothing else):
// the cheap pass for finding which processes name a file. Processes that
// vanish or that we may not look at are left out; any other failure is an
// error, as for Scan.
func (fs *FS) Cmdlines() (map[int][]string, error) {
	pids, err := fs.pids()
	if err != nil {
		return nil, err
	}
	return fs.CmdlinesOf(pids)
}

// CmdlinesOf is Cmdlines of pids only: a pid that is gone or hidden is
// left out.
func (fs *FS) CmdlinesOf(pids []int) (map[int][]string, error) {
	rootfd, err := syscall.Open(fs.root(), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read processes: %w", err)
	}
	defer syscall.Close(rootfd)
	out := make(map[int][]string, len(pids))
	buf := make([]byte, 0, 4096)
	for _, pid := range pids {
		data, err := fs.readFile(rootfd, strconv.Itoa(pid)+"/cmdline", pid, "cmdline", buf)
		if vanished(err) || denied(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read processes: %w", err)
		}
		buf = data[:0]
		if argv := parseCmdline(data); len(argv) > 0 {
			out[pid] = argv
		}
	}
	return out, nil
}

// RecentCmdlines is Cmdlines for callers that ask again and again (the
// daemon's scans) or twice in a row (one `gpumem ls`): it reads argv of
// the processes new since the last call, and reuses the rest. An argv read
// less than a second ago is reused as it is; one read the same at two
// calls in a row is reused until maxAge after it was last read; any other
// is read now. A process is the same as before while its /proc entry keeps
// its inode (a reused pid gets a new one). So an argv that changes late in
// a process's life (an exec long after its fork) shows within maxAge; one
// that changes right after the fork (fork, then exec at once, as launchers
// do) shows at the next call.
//
// Where Root is this process's own /proc, a call within maxAge of the last
// listing of /proc lists nothing: it reads the pids the allocator handed
// out since the call before (see allocatedSince; a reused pid is one of
// them), and keeps the processes known then. A process that exited since
// may then be returned, with the argv it had, until its argv is read again
// (within maxAge): the callers look at the process itself before they take
// it for anything (its environment, its port, its open files).
func (fs *FS) RecentCmdlines(maxAge time.Duration) (map[int][]string, error) {
	rootfd, err := fs.openRoot()
	if err != nil {
		return nil, err
	}
	defer syscall.Close(rootfd)
	fs.argvMu.Lock()
	defer fs.argvMu.Unlock()
	now := time.Now()
	if fs.now != nil {
		now = fs.now()
	}
	listed, err := fs.argvPidsLocked(rootfd, now, maxAge)
	if err != nil {
		return nil, err
	}
	var read []int
	out := make(map[int][]string, len(listed))
	for pid, ino := range listed {
		e, ok := fs.argv[pid]
		fresh := ok && e.ino == ino && (now.Sub(e.at) < time.Second || e.confirmed && now.Sub(e.at) < maxAge)
		if fresh {
			if len(e.argv) > 0 {
				out[pid] = e.argv
			}
			continue
		}
		read = append(read, pid)
	}
	argvs := make([][]string, len(read))
	found := make([]bool, len(read))
	errs := make([]error, len(read))
	parallel(len(read), func(i int, buf []byte) []byte {
		pid := read[i]
		data, err := fs.readFile(rootfd, strconv.Itoa(pid)+"/cmdline", pid, "cmdline", buf)
		switch {
		case vanished(err):
		case denied(err):
			// Kept, without argv: a process we may not look at is still
			// one the next call, which may list nothing, knows of.
			found[i] = true
		case err != nil:
			errs[i] = err
		default:
			argvs[i], found[i] = parseCmdline(data), true
		}
		return data[:0]
	})
	if err := firstError(errs); err != nil {
		// What this call found is not kept: list /proc at the next.
		fs.argvTracked = false
		return nil, err
	}
	if fs.argv == nil {
		fs.argv = map[int]argvEntry{}
	}
	for pid := range fs.argv {
		if _, ok := listed[pid]; !ok {
			delete(fs.argv, pid)
		}
	}
	for i, pid := range read {
		if !found[i] {
			delete(fs.argv, pid)
			continue
		}
		old, had := fs.argv[pid]
		same := had && old.ino == listed[pid] && slices.Equal(old.argv, argvs[i])
		fs.argv[pid] = argvEntry{ino: listed[pid], argv: argvs[i], at: now, confirmed: same}
		if len(argvs[i]) > 0 {
			out[pid] = argvs[i]
		}
	}
	return out, nil
}

// argvProbeLimit bounds the new pids a RecentCmdlines call reads one by
// one; past it, listing /proc costs less.
const argvProbeLimit = 4096

// argvPidsLocked is the processes RecentCmdlines looks at, each with the
// inode of its /proc entry: a listing of /proc, or (see RecentCmdlines)
// the processes argv knows and those the allocator handed a pid since the
// last call. Called with argvMu held.
func (fs *FS) argvPidsLocked(rootfd int, now time.Time, maxAge time.Duration) (map[int]uint64, error) {
	alloc := fs.argvAlloc
	if alloc == nil {
		if fs.argvOwn == 0 {
			fs.argvOwn = -1
			if fs.ownNamespace() {
				fs.argvOwn = 1
			}
		}
		if fs.argvOwn < 0 {
			return fs.listInodes()
		}
		alloc = fs.readCursor
	}
	// The allocator first: a process that starts after this look is the
	// next call's to read.
	cur, curErr := alloc()
	if curErr == nil && fs.argvTracked && now.Sub(fs.argvListedAt) < maxAge {
		if spans, ok := allocatedSince(fs.argvCursor, cur); ok && spanLen(spans) <= argvProbeLimit {
			listed, err := fs.argvProbeLocked(rootfd, spans)
			if err != nil {
				fs.argvTracked = false
				return nil, err
			}
			fs.argvCursor = cur
			return listed, nil
		}
	}
	listed, err := fs.listInodes()
	if err != nil {
		fs.argvTracked = false
		return nil, err
	}
	fs.argvCursor, fs.argvTracked, fs.argvListedAt = cur, curErr == nil, now
	return listed, nil
}

// argvProbeLocked is argvPidsLocked from the allocator: the processes argv
// knows whose pid was not handed out again since (one that was is gone),
// and each process (not a thread: status's Tgid says) that has a pid of
// spans now, its entry in argv dropped so that it is read. A pid without a
// task, or one we may not look at, is skipped; any other failure is an
// error.
func (fs *FS) argvProbeLocked(rootfd int, spans []pidSpan) (map[int]uint64, error) {
	inSpans := func(pid int) bool {
		for _, s := range spans {
			if pid >= s.lo && pid <= s.hi {
				return true
			}
		}
		return false
	}
	listed := make(map[int]uint64, len(fs.argv)+spanLen(spans))
	for pid, e := range fs.argv {
		if inSpans(pid) {
			delete(fs.argv, pid)
			continue
		}
		listed[pid] = e.ino
	}
	buf := make([]byte, 0, 1024)
	for _, s := range spans {
		for pid := s.lo; pid <= s.hi; pid++ {
			_, tgid, ok, err := fs.statusOf(rootfd, pid, buf)
			if err != nil {
				return nil, err
			}
			if !ok || tgid != 0 && tgid != pid { // gone, or a thread
				continue
			}
			// No inode: the entry is new, read whatever the inode; the
			// next listing gives it its inode (and reads it once more).
			listed[pid] = 0
		}
	}
	return listed, nil
}

// argvEntry is an argv RecentCmdlines read: of the process whose /proc
// entry had inode ino, at at; confirmed when the read before gave the same.
type argvEntry struct {
	ino       uint64
	argv      []string
	at        time.Time
	confirmed bool
}

// CommandLine is argv joined by spaces ("[comm]" when argv is empty: kernel
// threads, zombies, unreadable), with control characters shown as spaces,
// cut to at most max bytes on a rune boundary with "…": for logs, tables
// and messages.
func CommandLine(argv []string, comm string, max int) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.Join(argv, " "))
	if s == "" && comm != "" {
		s = "[" + comm + "]"
	}
	if len(s) <= max {
		return s
	}
	cut := max - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
