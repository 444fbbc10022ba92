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
func (fs *FS) RecentCmdlines(maxAge time.Duration) (map[int][]string, error) {
	listed, err := fs.listInodes()
	if err != nil {
		return nil, err
	}
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
		case vanished(err) || denied(err):
		case err != nil:
			errs[i] = err
		default:
			argvs[i], found[i] = parseCmdline(data), true
		}
		return data[:0]
	})
	if err := firstError(errs); err != nil {
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
