package procs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// New tasks since a look. Linux hands out pid numbers cyclically: each new
// task (process or thread) takes the next free number after the last one
// handed out, wrapping at pid_max. /proc/loadavg's last field is that last
// number, for the reader's pid namespace; /proc/stat's "processes" line
// counts every task created since boot. So every task created between two
// looks has a number in the cyclic range (last then, last now], unless the
// numbers went round the whole ring meanwhile, which takes at least as many
// new tasks as there were free numbers: the count of tasks created rules
// that out. A process whose pid was reused since the earlier look is a new
// task too, and lies in that range.

// cursor is one look at the pid allocator: its last pid, the tasks created
// since boot (all namespaces), pid_max, and the tasks alive now.
type cursor struct {
	last    int
	created uint64
	pidMax  int
	tasks   int
}

// parseLoadavg reads /proc/loadavg: "0.52 0.58 0.59 2/871 12345": the
// tasks alive (after the slash) and the last pid handed out.
func parseLoadavg(data []byte) (tasks, last int, err error) {
	f := bytes.Fields(data)
	if len(f) < 5 {
		return 0, 0, fmt.Errorf("loadavg: %d fields, want 5", len(f))
	}
	_, total, ok := bytes.Cut(f[3], []byte("/"))
	if !ok {
		return 0, 0, fmt.Errorf("loadavg: field 4 %q is not running/total", f[3])
	}
	if tasks, err = atoi(total); err != nil {
		return 0, 0, fmt.Errorf("loadavg: tasks: %w", err)
	}
	if last, err = atoi(f[4]); err != nil || last < 0 {
		return 0, 0, fmt.Errorf("loadavg: last pid %q", f[4])
	}
	return tasks, last, nil
}

// parseCreated reads the "processes" line of /proc/stat: tasks created
// since boot.
func parseCreated(data []byte) (uint64, error) {
	v := lineValue(data, "processes ")
	if v == nil {
		return 0, errors.New("stat: no processes line")
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat: processes: %w", err)
	}
	return n, nil
}

// pidSpan is the pids lo..hi, both included.
type pidSpan struct{ lo, hi int }

// allocatedSince is where the tasks created between two looks took their
// pids: the cyclic range after then.last up to now.last, as one or two
// spans (two when it wraps past pid_max; after a wrap Linux starts again
// above the reserved low pids, but every pid from 1 is included here).
// ok is false when the range cannot be trusted: the numbers may have gone
// round the whole ring (as many tasks created as there may have been free
// numbers), or pid_max changed.
func allocatedSince(then, now cursor) (spans []pidSpan, ok bool) {
	if now.pidMax != then.pidMax || now.pidMax <= 0 || now.created < then.created {
		return nil, false
	}
	// Going round the ring takes a new task for every free number; half of
	// them leaves room for tasks that came and went between the looks.
	free := now.pidMax - max(then.tasks, now.tasks)
	if free <= 0 || now.created-then.created >= uint64(free)/2 {
		return nil, false
	}
	switch {
	case now.last == then.last: // none in this namespace
		return nil, true
	case now.last > then.last:
		return []pidSpan{{then.last + 1, now.last}}, true
	default:
		spans = []pidSpan{{1, now.last}}
		if then.last+1 < now.pidMax {
			spans = append(spans, pidSpan{then.last + 1, now.pidMax - 1})
		}
		return spans, true
	}
}

// spanLen is how many pids the spans hold.
func spanLen(spans []pidSpan) int {
	n := 0
	for _, s := range spans {
		n += s.hi - s.lo + 1
	}
	return n
}

// readCursor looks at the pid allocator through fs's root.
func (fs *FS) readCursor() (cursor, error) {
	var c cursor
	data, err := os.ReadFile(filepath.Join(fs.root(), "loadavg"))
	if err != nil {
		return c, err
	}
	if c.tasks, c.last, err = parseLoadavg(data); err != nil {
		return c, err
	}
	if data, err = os.ReadFile(filepath.Join(fs.root(), "stat")); err != nil {
		return c, err
	}
	if c.created, err = parseCreated(data); err != nil {
		return c, err
	}
	if data, err = os.ReadFile(filepath.Join(fs.root(), "sys", "kernel", "pid_max")); err != nil {
		return c, err
	}
	if c.pidMax, err = atoi(bytes.TrimSpace(data)); err != nil {
		return c, fmt.Errorf("pid_max: %w", err)
	}
	return c, nil
}

// ownNamespace reports whether fs's root is the /proc of this process's
// own pid namespace: its "self" is this process under its own pid, with
// one pid in NSpid. Only then do its loadavg's pids and the pids that
// pidfd_open takes name the processes it lists. A host's /proc mounted in
// a container, or a fixture tree, is not.
func (fs *FS) ownNamespace() bool {
	link, err := os.Readlink(filepath.Join(fs.root(), "self"))
	if err != nil || link != strconv.Itoa(os.Getpid()) {
		return false
	}
	data, err := os.ReadFile(filepath.Join(fs.root(), "self", "status"))
	if err != nil {
		return false
	}
	st, err := parseStatus(data)
	return err == nil && len(st.NSpid) == 1
}

// probe reads, for each pid of spans, its stat: the new tasks. A pid
// without a process (gone, or never) is skipped, as is one we may not look
// at; any other failure is an error. Threads answer too (/proc/<tid> is
// there, unlisted): the caller tells them apart (isThread) where it
// matters.
func (fs *FS) probe(rootfd int, spans []pidSpan) ([]Proc, error) {
	var out []Proc
	buf := make([]byte, 0, 1024)
	for _, s := range spans {
		for pid := s.lo; pid <= s.hi; pid++ {
			p, ok, next, err := fs.readStat(rootfd, pid, buf)
			buf = next[:0]
			if err != nil {
				return nil, fmt.Errorf("read processes: %w", err)
			}
			if ok {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// statusOf reads and parses pid's status; ok is false when the process is
// gone or hidden.
func (fs *FS) statusOf(rootfd, pid int, buf []byte) (st statusFields, tgid int, ok bool, err error) {
	buf, err = fs.readFile(rootfd, strconv.Itoa(pid)+"/status", pid, "status", buf)
	if vanished(err) || denied(err) {
		return st, 0, false, nil
	}
	if err != nil {
		return st, 0, false, fmt.Errorf("read processes: %w", err)
	}
	if st, err = parseStatus(buf); err != nil {
		return st, 0, false, fs.malformed(pid, "status", err)
	}
	if v := lineValue(buf, "Tgid:"); v != nil {
		tgid, _ = atoi(bytes.TrimSpace(v))
	}
	return st, tgid, true, nil
}

// openRoot opens fs's root as a directory.
func (fs *FS) openRoot() (int, error) {
	fd, err := syscall.Open(fs.root(), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("read processes: %w", err)
	}
	return fd, nil
}

// listInodes lists the processes of fs's root with the inode of each one's
// directory. procfs gives a process's directory a new inode when its pid is
// reused (the old entry is dropped at the old process's exit), so a pid
// listed with another inode than before is another process.
func (fs *FS) listInodes() (map[int]uint64, error) {
	fd, err := fs.openRoot()
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	out := map[int]uint64{}
	buf := make([]byte, 32<<10)
	for {
		n, err := syscall.Getdents(fd, buf)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read processes: %w", err)
		}
		if n <= 0 {
			return out, nil
		}
		if err := parseDirents(buf[:n], out); err != nil {
			return nil, fmt.Errorf("read processes: %s: %w", fs.root(), err)
		}
	}
}

// parseDirents adds the numeric entries of a getdents64 buffer (struct
// linux_dirent64: inode, offset, record length, type, name) to into, by
// pid.
func parseDirents(b []byte, into map[int]uint64) error {
	for len(b) > 0 {
		if len(b) < 19 {
			return fmt.Errorf("dirent of %d bytes", len(b))
		}
		reclen := int(binary.LittleEndian.Uint16(b[16:18]))
		if reclen < 19 || reclen > len(b) {
			return fmt.Errorf("dirent record length %d of %d bytes", reclen, len(b))
		}
		name := b[19:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if len(name) > 0 && name[0] >= '1' && name[0] <= '9' {
			if pid, err := atoi(name); err == nil {
				into[pid] = binary.LittleEndian.Uint64(b[0:8])
			}
		}
		b = b[reclen:]
	}
	return nil
}

// nspidIndex reads every process's status for its NSpid: innermost pid →
// this /proc's pid, for the processes of nested pid namespaces. An
// innermost pid that several processes share (two containers' pid 7) is
// left out: it names no one process.
func (fs *FS) nspidIndex(rootfd int) (map[int]int, error) {
	pids, err := fs.pids()
	if err != nil {
		return nil, err
	}
	inner := make([]int, len(pids))
	errs := make([]error, len(pids))
	parallel(len(pids), func(i int, buf []byte) []byte {
		st, _, ok, err := fs.statusOf(rootfd, pids[i], buf)
		if err != nil {
			errs[i] = err
		} else if ok && len(st.NSpid) > 1 {
			inner[i] = st.NSpid[len(st.NSpid)-1]
		}
		return buf
	})
	if err := firstError(errs); err != nil {
		return nil, err
	}
	out := map[int]int{}
	shared := map[int]bool{}
	for i, in := range inner {
		if in == 0 {
			continue
		}
		if _, dup := out[in]; dup {
			shared[in] = true
		}
		out[in] = pids[i]
	}
	for in := range shared {
		delete(out, in)
	}
	return out, nil
}
