package procs

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// FS reads processes from a /proc tree. The zero value reads /proc. An FS
// caches user names across scans; use it by pointer.
type FS struct {
	// Root is the proc mount to read ("" means /proc); tests point it at
	// fixture trees under testdata/.
	Root string

	mu    sync.Mutex
	users map[uint32]string

	argvMu sync.Mutex
	argv   map[int]argvEntry // RecentCmdlines' argv by pid
	// What RecentCmdlines knows of the pid allocator (see allocatedSince):
	// with argvTracked, argv has an entry for every process alive at
	// argvCursor, and the next call reads the pids handed out since
	// instead of listing /proc. argvListedAt is the last listing; argvOwn
	// whether Root is this process's own /proc (0: not looked at yet, 1
	// yes, -1 no): only there does the allocator name its pids.
	argvCursor   cursor
	argvTracked  bool
	argvListedAt time.Time
	argvOwn      int8

	// Test hooks.
	lookupUser func(uid uint32) (string, error) // nil: os/user
	argvAlloc  func() (cursor, error)           // RecentCmdlines' allocator; nil: readCursor, where argvOwn
	now        func() time.Time                 // nil: time.Now
	beforeRead func(pid int)                    // called before a process's files are read
	// fault, when it returns an error, makes the read of a process's file
	// ("stat", "status", "cmdline", "environ"; "" for its directory) fail
	// with it, as if the open had.
	fault func(pid int, file string) error
}

func (fs *FS) root() string {
	if fs.Root == "" {
		return "/proc"
	}
	return fs.Root
}

// Scan reads every process in full (Detailed): stat, status, cmdline and
// environ. A process is left out only when /proc says it is gone (ENOENT,
// ESRCH: it exited while the scan ran) or that we may not look at it
// (EACCES, EPERM: hidepid, another user's environ loses only that file).
// Any other failure (EMFILE, ENOMEM, EIO, a malformed file) fails the whole
// scan: a table missing a live process would say it exited, and the daemon
// ends a dead kernel's children. On a box with thousands of processes prefer
// ScanTree, which reads one file per process.
func (fs *FS) Scan() (*Table, error) {
	return fs.scan(true, nil)
}

// ScanTree reads every process's stat — enough for the tree, sessions,
// process groups and start times — and reads in full (Detailed) only the
// processes listed in details (typically the GPU processes and the kernels).
// A listed pid that is not a pid of this /proc may be one from a nested pid
// namespace: then the NSpid of every process is read (status) to find the
// one process whose innermost pid it is, and that one is read in full.
func (fs *FS) ScanTree(details []int) (*Table, error) {
	return fs.scan(false, details)
}

func (fs *FS) scan(full bool, details []int) (*Table, error) {
	rootfd, kept, err := fs.readAll(full)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(rootfd)
	if !full && len(details) > 0 {
		if err := fs.readDetails(rootfd, kept, details); err != nil {
			return nil, err
		}
	}
	fs.resolveUsers(kept)
	return NewTable(kept), nil
}

// readAll reads every process (its stat, or in full) and returns them with
// an open descriptor of the root, which the caller closes.
func (fs *FS) readAll(full bool) (rootfd int, kept []Proc, err error) {
	pids, err := fs.pids()
	if err != nil {
		return -1, nil, err
	}
	rootfd, err = syscall.Open(fs.root(), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, fmt.Errorf("read processes: %w", err)
	}

	procs := make([]Proc, len(pids))
	ok := make([]bool, len(pids))
	errs := make([]error, len(pids))
	parallel(len(pids), func(i int, buf []byte) []byte {
		if full {
			procs[i], ok[i], buf, errs[i] = fs.readProc(pids[i], buf)
		} else {
			procs[i], ok[i], buf, errs[i] = fs.readStat(rootfd, pids[i], buf)
		}
		return buf
	})
	if err := firstError(errs); err != nil {
		syscall.Close(rootfd)
		return -1, nil, err
	}
	kept = procs[:0]
	for i := range procs {
		if ok[i] {
			kept = append(kept, procs[i])
		}
	}
	return rootfd, kept, nil
}

// firstError is the first of errs that is not nil, saying how many more
// failed (a scan out of descriptors fails for most processes alike); nil
// when none.
func firstError(errs []error) error {
	var first error
	n := 0
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	if n > 1 {
		return fmt.Errorf("read processes: %w (and %d more)", first, n-1)
	}
	if first != nil {
		return fmt.Errorf("read processes: %w", first)
	}
	return nil
}

// readDetails reads in full the processes of procs that details names,
// directly or through NSpid (see ScanTree). Errors are as Scan's.
func (fs *FS) readDetails(rootfd int, procs []Proc, details []int) error {
	index := make(map[int]int, len(procs))
	for i, p := range procs {
		index[p.PID] = i
	}
	var targets []int
	var missing []int
	for _, pid := range details {
		if i, ok := index[pid]; ok {
			targets = append(targets, i)
		} else {
			missing = append(missing, pid)
		}
	}
	if len(missing) > 0 {
		inner := make(map[int][]int) // innermost pid → indexes
		var mu sync.Mutex
		errs := make([]error, len(procs))
		parallel(len(procs), func(i int, buf []byte) []byte {
			pid := procs[i].PID
			buf, err := fs.readFile(rootfd, strconv.Itoa(pid)+"/status", pid, "status", buf)
			if vanished(err) || denied(err) {
				return buf
			}
			if err != nil {
				errs[i] = err
				return buf
			}
			st, err := parseStatus(buf)
			if err != nil {
				errs[i] = fs.malformed(pid, "status", err)
				return buf
			}
			if len(st.NSpid) < 2 {
				return buf
			}
			procs[i].NSpid = st.NSpid
			mu.Lock()
			inner[st.NSpid[len(st.NSpid)-1]] = append(inner[st.NSpid[len(st.NSpid)-1]], i)
			mu.Unlock()
			return buf
		})
		if err := firstError(errs); err != nil {
			return err
		}
		for _, pid := range missing {
			if idx := inner[pid]; len(idx) == 1 {
				targets = append(targets, idx[0])
			}
		}
	}
	buf := make([]byte, 4096)
	for _, i := range targets {
		full, ok, next, err := fs.readProc(procs[i].PID, buf)
		buf = next
		if err != nil {
			return fmt.Errorf("read processes: %w", err)
		}
		// Another start time: the pid was reused since the stat pass; keep
		// the tree's entry rather than mix two processes. Gone since the
		// stat pass: the entry stays as read then.
		if ok && full.StartTime == procs[i].StartTime {
			procs[i] = full
		}
	}
	return nil
}

// parallel runs fn(0..n-1) on a few workers, each with its own buffer.
// Reading /proc is syscall-bound: workers overlap the syscalls.
func parallel(n int, fn func(i int, buf []byte) []byte) {
	workers := min(runtime.GOMAXPROCS(0), 8, max(1, n/64))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			buf := make([]byte, 4096)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				buf = fn(i, buf)
			}
		})
	}
	wg.Wait()
}

// readStat reads only <pid>/stat: one open, one read, one close. ok is
// false, with no error, for a process that is gone or hidden from us.
func (fs *FS) readStat(rootfd, pid int, buf []byte) (p Proc, ok bool, _ []byte, err error) {
	if fs.beforeRead != nil {
		fs.beforeRead(pid)
	}
	buf, err = fs.readFile(rootfd, strconv.Itoa(pid)+"/stat", pid, "stat", buf)
	if vanished(err) || denied(err) {
		return Proc{}, false, buf, nil
	}
	if err != nil {
		return Proc{}, false, buf, err
	}
	st, err := fs.parseStatOf(pid, buf)
	if err != nil {
		return Proc{}, false, buf, err
	}
	return Proc{PID: pid, PPID: st.PPID, PGID: st.PGID, SID: st.SID, StartTime: st.StartTime, Comm: st.Comm, State: st.State}, true, buf, nil
}

// parseStatOf parses pid's stat, which must be pid's.
func (fs *FS) parseStatOf(pid int, data []byte) (statFields, error) {
	st, err := parseStat(data)
	if err == nil && st.PID != pid {
		err = fmt.Errorf("it names pid %d", st.PID)
	}
	if err != nil {
		return st, fs.malformed(pid, "stat", err)
	}
	return st, nil
}

// malformed is the error of a file of pid that /proc cannot have written.
func (fs *FS) malformed(pid int, file string, err error) error {
	return fmt.Errorf("%s: malformed: %w", filepath.Join(fs.root(), strconv.Itoa(pid), file), err)
}

// pids lists the numeric entries of the root.
func (fs *FS) pids() ([]int, error) {
	dir, err := os.Open(fs.root())
	if err != nil {
		return nil, fmt.Errorf("read processes: %w", err)
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read processes: %w", err)
	}
	pids := make([]int, 0, len(names))
	for _, name := range names {
		if name[0] < '1' || name[0] > '9' {
			continue
		}
		if pid, err := strconv.Atoi(name); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// readProc reads one process through a descriptor of its /proc directory:
// once the process exits that descriptor answers ESRCH/ENOENT, even if the
// pid is reused meanwhile, so the files read all describe one process. ok
// is false, with no error, for a process that is gone (or hidden from us);
// a file we may not read (EACCES: another user's environ) loses only that
// file; any other failure is an error.
func (fs *FS) readProc(pid int, buf []byte) (p Proc, ok bool, _ []byte, err error) {
	if fs.beforeRead != nil {
		fs.beforeRead(pid)
	}
	dirfd, err := fs.openDir(pid)
	if vanished(err) || denied(err) {
		return Proc{}, false, buf, nil
	}
	if err != nil {
		return Proc{}, false, buf, err
	}
	defer syscall.Close(dirfd)

	buf, err = fs.readFile(dirfd, "stat", pid, "stat", buf)
	if vanished(err) || denied(err) {
		return Proc{}, false, buf, nil
	}
	if err != nil {
		return Proc{}, false, buf, err
	}
	st, err := fs.parseStatOf(pid, buf)
	if err != nil {
		return Proc{}, false, buf, err
	}
	p = Proc{PID: pid, PPID: st.PPID, PGID: st.PGID, SID: st.SID, StartTime: st.StartTime, Comm: st.Comm, State: st.State, Detailed: true}

	// Once stat was read, ENOENT or ESRCH from the process's other files
	// means it exited meanwhile: skip it rather than keep half a process.
	buf, err = fs.readFile(dirfd, "status", pid, "status", buf)
	switch {
	case vanished(err):
		return Proc{}, false, buf, nil
	case denied(err):
		// The directory's owner is the effective uid for dumpable processes.
		var sys syscall.Stat_t
		if err := syscall.Fstat(dirfd, &sys); err != nil {
			return Proc{}, false, buf, fmt.Errorf("%s: %w", filepath.Join(fs.root(), strconv.Itoa(pid)), err)
		}
		p.UID = sys.Uid
	case err != nil:
		return Proc{}, false, buf, err
	default:
		status, err := parseStatus(buf)
		if err != nil {
			return Proc{}, false, buf, fs.malformed(pid, "status", err)
		}
		p.UID, p.NSpid = status.UID, status.NSpid
	}
	buf, err = fs.readFile(dirfd, "cmdline", pid, "cmdline", buf)
	switch {
	case vanished(err):
		return Proc{}, false, buf, nil
	case err == nil:
		p.Argv = parseCmdline(buf)
	case !denied(err):
		return Proc{}, false, buf, err
	}
	// environ is readable by the same user or root only: EACCES is normal.
	buf, err = fs.readFile(dirfd, "environ", pid, "environ", buf)
	switch {
	case vanished(err):
		return Proc{}, false, buf, nil
	case err == nil:
		p.SessionName, _ = environValue(buf, "JPY_SESSION_NAME")
	case !denied(err):
		return Proc{}, false, buf, err
	}
	return p, true, buf, nil
}

// openDir opens <root>/<pid> as a directory.
func (fs *FS) openDir(pid int) (int, error) {
	path := filepath.Join(fs.root(), strconv.Itoa(pid))
	if fs.fault != nil {
		if err := fs.fault(pid, ""); err != nil {
			return -1, &os.PathError{Op: "open", Path: path, Err: err}
		}
	}
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// readFile reads rel (relative to dirfd), a file of process pid named
// file, into buf as readAt does; errors name the file.
func (fs *FS) readFile(dirfd int, rel string, pid int, file string, buf []byte) ([]byte, error) {
	var err error
	if fs.fault != nil {
		err = fs.fault(pid, file)
	}
	if err == nil {
		buf, err = readAt(dirfd, rel, buf)
	}
	if err != nil {
		return buf[:0], &os.PathError{Op: "read", Path: filepath.Join(fs.root(), strconv.Itoa(pid), file), Err: err}
	}
	return buf, nil
}

// Exited reports whether the process (pid, start) is over, as /proc says
// it: its directory or stat is gone (ENOENT, ESRCH), the pid now names a
// process that started at another time (reused), or it is a zombie (it
// exited; its parent has not reaped it yet, as a script's KernelManager
// that does not poll its kernel). A scan that misses a process says
// nothing by itself: this is the targeted look that confirms an exit. Any
// failure to look (EMFILE, EACCES, ...) is an error, never an exit.
func (fs *FS) Exited(pid int, start uint64) (bool, error) {
	dirfd, err := fs.openDir(pid)
	if vanished(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer syscall.Close(dirfd)
	buf, err := fs.readFile(dirfd, "stat", pid, "stat", make([]byte, 0, 1024))
	if vanished(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	st, err := fs.parseStatOf(pid, buf)
	if err != nil {
		return false, err
	}
	return st.StartTime != start || (Proc{State: st.State}).Exited(), nil
}

// vanished: /proc says the process is gone.
func vanished(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESRCH)
}

// denied: /proc does not let us look (hidepid, another user's environ);
// the process is not gone.
func denied(err error) bool {
	return errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)
}

// readAt reads the whole file name (relative to dirfd) into buf, grown as
// needed, and returns the filled part. /proc files report size 0, so it
// reads until a short read instead of trusting fstat.
func readAt(dirfd int, name string, buf []byte) ([]byte, error) {
	fd, err := syscall.Openat(dirfd, name, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return buf[:0], err
	}
	defer syscall.Close(fd)
	buf = buf[:cap(buf)]
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf))...)
		}
		m, err := syscall.Read(fd, buf[n:])
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return buf[:0], err
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
		if n < len(buf) {
			// A short read is the end for /proc files and regular files
			// alike; skipping the read that would return 0 saves a syscall
			// per file (syscalls are most of a scan's cost).
			return buf[:n], nil
		}
	}
}

// resolveUsers fills User from UID through os/user, cached in fs; a uid
// without a name shows as the number.
func (fs *FS) resolveUsers(procs []Proc) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.users == nil {
		fs.users = make(map[uint32]string)
	}
	for i := range procs {
		if !procs[i].Detailed {
			continue
		}
		uid := procs[i].UID
		name, ok := fs.users[uid]
		if !ok {
			name = fs.userName(uid)
			fs.users[uid] = name
		}
		procs[i].User = name
	}
}

func (fs *FS) userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	lookup := fs.lookupUser
	if lookup == nil {
		lookup = func(uint32) (string, error) {
			u, err := user.LookupId(id)
			if err != nil {
				return "", err
			}
			return u.Username, nil
		}
	}
	if name, err := lookup(uid); err == nil && name != "" {
		return name
	}
	return id
}
