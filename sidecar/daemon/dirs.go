package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem/sidecar/api"
)

// dirLocks holds an exclusive flock on each runtime dir the daemon serves
// (on the directory itself: no file is created, and a dir the daemon may
// only read can still be locked), so that one runtime dir has one daemon,
// whatever socket each was given. A dir that does not exist yet is locked
// when it appears; one deleted and made anew is locked again.
//
// The configured dirs (own) are locked for the daemon's life. Other
// users' dirs (--all-users: any dir a user's process names) cost a
// descriptor each while locked, so one is locked only while a kernel in it
// is followed (hold, release); at each scan the others are only checked:
// locked and let go at once, to leave a dir that its user's own daemon
// serves to it.
type dirLocks struct {
	mu    sync.Mutex
	own   []string
	users []string            // other users' dirs to scan now (setUsers)
	held  map[string]*os.File // dir → locked descriptor
}

func newDirLocks(dirs []string) *dirLocks {
	return &dirLocks{own: dirs, held: map[string]*os.File{}}
}

// ErrDirTaken is matched (errors.Is) by Run's error when another daemon
// watches one of its runtime dirs (it holds the dir's flock).
var ErrDirTaken = errors.New("another gpumem daemon is serving this runtime dir")

// lock takes or re-takes the lock of every own dir that exists and checks
// every user dir; it returns the dirs the daemon may scan (locked, free,
// or not there yet) and the errors of dirs another daemon holds.
func (l *dirLocks) lock() (watch []string, errs []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, dir := range l.own {
		if err := l.lockOneLocked(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
			watch = append(watch, dir) // locked, or nothing there to serve yet
		} else {
			errs = append(errs, err)
		}
	}
	for _, dir := range l.users {
		held := l.held[dir] != nil
		err := l.lockOneLocked(dir)
		if err == nil && !held {
			l.releaseLocked(dir) // free: checked, not kept
		}
		switch {
		case err == nil:
			watch = append(watch, dir)
		case errors.Is(err, fs.ErrNotExist):
		default:
			errs = append(errs, err)
		}
	}
	return watch, errs
}

// isOwn reports whether dir is one of the configured dirs.
func (l *dirLocks) isOwn(dir string) bool { return slices.Contains(l.own, dir) }

// setUsers makes dirs the user dirs to scan (an own dir among them stays
// own), lets go of those no longer among them, and returns the new ones.
func (l *dirLocks) setUsers(dirs []string) (added []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := map[string]bool{}
	var users []string
	for _, d := range dirs {
		if now[d] || l.isOwn(d) {
			continue
		}
		now[d] = true
		users = append(users, d)
		if !slices.Contains(l.users, d) {
			added = append(added, d)
		}
	}
	for _, d := range l.users {
		if !now[d] {
			l.releaseLocked(d)
		}
	}
	l.users = users
	return added
}

// usersAmong is the user dirs among dirs.
func (l *dirLocks) usersAmong(dirs map[string]bool) map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]bool{}
	for _, d := range l.users {
		if dirs[d] {
			out[d] = true
		}
	}
	return out
}

// hold keeps a user dir locked while a kernel in it is followed; false
// when another daemon holds it. An own dir is held already; any other dir
// (a kernel launched with a file elsewhere) is no runtime dir to lock.
func (l *dirLocks) hold(dir string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isOwn(dir) || !slices.Contains(l.users, dir) {
		return true
	}
	return l.lockOneLocked(dir) == nil
}

// release lets go of the user dirs that hold no followed kernel (not in
// inUse).
func (l *dirLocks) release(inUse map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for dir := range l.held {
		if !l.isOwn(dir) && !inUse[dir] {
			l.releaseLocked(dir)
		}
	}
}

// heldCount is how many dirs are locked now (one descriptor each).
func (l *dirLocks) heldCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

func (l *dirLocks) lockOneLocked(dir string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		l.releaseLocked(dir)
		return &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	if f := l.held[dir]; f != nil {
		var cur unix.Stat_t
		if unix.Fstat(int(f.Fd()), &cur) == nil && cur.Dev == st.Dev && cur.Ino == st.Ino {
			return nil // still the dir we locked
		}
		l.releaseLocked(dir)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("runtime dir %s: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), dir)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("runtime dir %s: %w: stop it, or watch other dirs", dir, ErrDirTaken)
		}
		return fmt.Errorf("lock runtime dir %s: %w", dir, err)
	}
	l.held[dir] = f
	return nil
}

func (l *dirLocks) releaseLocked(dir string) {
	if f := l.held[dir]; f != nil {
		f.Close()
		delete(l.held, dir)
	}
}

// close releases every lock.
func (l *dirLocks) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for dir := range l.held {
		l.releaseLocked(dir)
	}
}

// watchedDirs is the runtime dirs this daemon serves now: those it holds,
// or that do not exist yet. A dir another daemon took is logged once.
func (d *Daemon) watchedDirs() []string {
	watch, errs := d.disc.locks.lock()
	for _, err := range errs {
		d.problem(err)
	}
	return watch
}

// socketKeeper serves the API on the daemon's socket and serves it anew
// when the socket file goes (its dir deleted, as a user cleaning a runtime
// dir does): clients find the daemon where they look for it.
type socketKeeper struct {
	path string
	mode api.Mode
	srv  *api.Server

	wg     sync.WaitGroup
	mu     sync.Mutex
	ln     *api.Listener
	id     [2]uint64 // dev, ino of the socket file served
	cancel context.CancelFunc
	errc   chan error
}

func (k *socketKeeper) serve(ctx context.Context, ln *api.Listener) {
	lctx, cancel := context.WithCancel(ctx)
	k.mu.Lock()
	k.ln, k.cancel = ln, cancel
	k.id, _ = fileIdentity(k.path)
	k.mu.Unlock()
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		if err := k.srv.Serve(lctx, ln); err != nil && lctx.Err() == nil {
			select {
			case k.errc <- fmt.Errorf("local API: %w", err):
			default:
			}
		}
	}()
}

// check serves the socket anew if its file is gone or was replaced. It
// reports whether it did.
func (k *socketKeeper) check(ctx context.Context) (bool, error) {
	id, ok := fileIdentity(k.path)
	k.mu.Lock()
	same := ok && id == k.id
	old, oldCancel := k.ln, k.cancel
	k.mu.Unlock()
	if same {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(k.path), 0o700); err != nil {
		return false, fmt.Errorf("recreate socket dir: %w", err)
	}
	ln, err := api.Listen(ctx, k.path, k.mode)
	if err != nil {
		return false, err
	}
	old.Abandon() // its path now names the new socket: closing must not unlink it
	oldCancel()
	k.serve(ctx, ln)
	return true, nil
}

// wait returns when every Serve has.
func (k *socketKeeper) wait() { k.wg.Wait() }

func fileIdentity(path string) ([2]uint64, bool) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return [2]uint64{}, false
	}
	return [2]uint64{st.Dev, st.Ino}, true
}

// problemEvery is how often the same problem is logged at warn level: a
// broken file found at every rescan must not flood the log.
const problemEvery = 10 * time.Minute

// problem logs a discovery or attach problem at warn level, once per
// problemEvery for the same text, and at debug level in between.
func (d *Daemon) problem(err error) {
	msg := err.Error()
	now := time.Now()
	d.problems.mu.Lock()
	last, seen := d.problems.last[msg]
	if !seen || now.Sub(last) >= problemEvery {
		if len(d.problems.last) >= 1000 {
			for m, at := range d.problems.last {
				if now.Sub(at) >= problemEvery {
					delete(d.problems.last, m)
				}
			}
		}
		d.problems.last[msg] = now
	}
	d.problems.mu.Unlock()
	if !seen || now.Sub(last) >= problemEvery {
		d.log.Warn().Err(err).Msg("discovery")
		return
	}
	d.log.Debug().Err(err).Msg("discovery")
}
