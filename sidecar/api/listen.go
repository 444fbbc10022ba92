package api

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MaxSocketPath is the longest path Linux accepts in sockaddr_un (108 bytes
// with the terminating NUL).
const MaxSocketPath = 107

// staleCheckTimeout bounds the connect that tells a live socket from a stale one.
const staleCheckTimeout = 2 * time.Second

// ErrServed is matched (errors.Is) by Listen's error when another daemon
// serves the path: its caller may say which (it holds "<path>.lock").
var ErrServed = errors.New("another gpumem daemon is serving the socket")

// servedError is Listen's refusal of a path another daemon serves.
type servedError struct{ path, detail string }

func (e *servedError) Error() string        { return "another gpumem daemon is serving " + e.path + e.detail }
func (e *servedError) Is(target error) bool { return target == ErrServed }

// Listener is the daemon's unix socket. It holds an exclusive lock on
// "<path>.lock" for its lifetime, so that two daemons starting at once cannot
// both decide the socket is stale and replace each other's. Close removes the
// socket file; the lock file stays (removing it would race with a new daemon).
type Listener struct {
	ul   *net.UnixListener
	path string
	mode Mode
	lock *os.File

	closeOnce sync.Once
	closeErr  error
	keepFile  atomic.Bool
}

// Listen creates the unix socket at path with the permissions of mode (0600
// private, 0666 shared, whatever the umask). An existing socket file is
// replaced only when nothing answers on it; a live one gives the error
// "another gpumem daemon is serving <path>". A path that exists and is not a
// socket is never touched.
func Listen(ctx context.Context, path string, mode Mode) (*Listener, error) {
	perm, err := mode.perm()
	if err != nil {
		return nil, err
	}
	if len(path) > MaxSocketPath {
		return nil, fmt.Errorf("socket path %s is %d bytes long, Linux allows %d: choose a shorter socket path", path, len(path), MaxSocketPath)
	}
	if err := checkSocketDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	lock, err := lockFile(path)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = lock.Close() // releases the flock
		}
	}()
	if err := removeStale(ctx, path); err != nil {
		return nil, err
	}
	lc := net.ListenConfig{
		// Set the socket's mode before bind creates the file, so that it is
		// never more open than asked (Linux takes the file's mode from the
		// socket inode, minus the umask). The Chmod below then loosens it to
		// exactly perm for shared mode.
		Control: func(_, _ string, c syscall.RawConn) error {
			var chmodErr error
			if err := c.Control(func(fd uintptr) {
				chmodErr = unix.Fchmod(int(fd), perm)
			}); err != nil {
				return err
			}
			return chmodErr
		},
	}
	ln, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, &servedError{path: path}
		}
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ul := ln.(*net.UnixListener)
	if err := os.Chmod(path, fs.FileMode(perm)); err != nil {
		_ = ul.Close()
		return nil, fmt.Errorf("set mode %#o on %s: %w", perm, path, err)
	}
	ok = true
	return &Listener{ul: ul, path: path, mode: mode, lock: lock}, nil
}

// checkSocketDir refuses a socket dir that anyone but its owner may write,
// or that belongs to another user than the daemon's (root excepted): there,
// another user could plant the socket, its lock or the alert file, or swap
// them for links to files the daemon would then overwrite.
func checkSocketDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("socket dir %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("socket dir %s is not a directory (%s): choose another socket path", dir, fi.Mode().Type())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if self := uint32(os.Geteuid()); st.Uid != self && st.Uid != 0 {
		return fmt.Errorf("socket dir %s belongs to uid %d, not to this daemon's uid %d: choose a dir of your own with --socket", dir, st.Uid, self)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("socket dir %s is writable by others (mode %#o): choose a dir only you can write with --socket (e.g. /run/gpumem, mode 0755)", dir, fi.Mode().Perm())
	}
	return nil
}

// lockFile takes a non-blocking exclusive flock on "<socketPath>.lock",
// creating it 0644 (readable, so that a daemon of another user can still
// take the lock after a root daemon created the file).
func lockFile(socketPath string) (*os.File, error) {
	path := socketPath + ".lock"
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &servedError{path: socketPath, detail: " (it holds " + path + ")"}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// removeStale removes a socket file at path that nobody answers on.
func removeStale(ctx context.Context, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check socket %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket (%s): remove it or choose another socket path", path, fi.Mode().Type())
	}
	ctx, cancel := context.WithTimeout(ctx, staleCheckTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	switch {
	case err == nil:
		_ = conn.Close()
		return &servedError{path: path}
	case errors.Is(err, syscall.ECONNREFUSED):
		// Stale: its daemon died without removing it.
	case errors.Is(err, syscall.ENOENT):
		return nil // removed meanwhile
	default:
		return fmt.Errorf("check whether a daemon serves %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) { return l.ul.Accept() }

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return l.ul.Addr() }

// Path is the socket file's path.
func (l *Listener) Path() string { return l.path }

// Mode is the mode the socket was created with.
func (l *Listener) Mode() Mode { return l.mode }

// Abandon makes Close leave the socket file alone: the path already names
// a new socket (the old one's dir was deleted and the daemon listens anew).
// Close applies it, in the goroutine that closes.
func (l *Listener) Abandon() { l.keepFile.Store(true) }

// Close stops accepting, removes the socket file and releases the lock.
// It is safe to call more than once.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		if l.keepFile.Load() {
			l.ul.SetUnlinkOnClose(false)
		}
		err := l.ul.Close() // unlinks the socket file unless abandoned
		if lerr := l.lock.Close(); lerr != nil && err == nil {
			err = lerr
		}
		l.closeErr = err
	})
	return l.closeErr
}
