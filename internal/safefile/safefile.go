// Package safefile reads files that someone else may control (connection
// files, server files, kernelspecs, the simulated-GPU file) without letting
// them hang or bloat the reader: only regular files are read, never more
// than a cap, and opening never blocks (a FIFO or a device named like a
// Jupyter file is an error, not a wait), and a symbolic link is never
// followed to its target: a root daemon that followed a link a user planted
// in their own dir would read, as root, a file that user may not read. It
// owns nothing else.
package safefile

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Info is what the file was when it was read: its owner and identity, and
// the owner of the dir it was opened in (0 for ReadInRoot, which opens
// through a root, not a dir).
type Info struct {
	UID    uint32
	Dev    uint64
	Ino    uint64
	DirUID uint32
}

// ErrNotRegular is returned for anything but a regular file.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is returned for a file longer than the cap.
var ErrTooLarge = errors.New("file too large")

// ErrSymlink is returned for a symbolic link: its target is not read.
var ErrSymlink = errors.New("a symbolic link, not followed")

// Read returns the contents of the regular file at path, at most max bytes.
// The dir is opened first (links in the dir's own path are followed: the
// caller chose or checked the dir), then the file through the dir's
// descriptor with O_NOFOLLOW, so a link in the file's place is an error,
// never a read of its target, and the dir's owner is the one of the dir the
// file was read in (Info.DirUID). O_NONBLOCK makes opening a FIFO return at
// once (and is harmless for a regular file); the type is then checked on the
// open descriptor, so a swap between a check and the open cannot fool it.
// Errors name the path.
func Read(path string, max int64) ([]byte, Info, error) {
	data, info, _, err := ReadStamped(path, max)
	return data, info, err
}

// ReadStamped is Read that also returns the file's Stamp, taken by the
// fstat of the descriptor it read.
func ReadStamped(path string, max int64) ([]byte, Info, Stamp, error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if name == "" || name == "." || name == ".." {
		return nil, Info{}, Stamp{}, fmt.Errorf("%s: %w (a directory)", path, ErrNotRegular)
	}
	dirFD, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, Info{}, Stamp{}, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(dirFD)
	var dst unix.Stat_t
	if err := unix.Fstat(dirFD, &dst); err != nil {
		return nil, Info{}, Stamp{}, &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	// One name, opened with O_NOFOLLOW: what openat2's RESOLVE_NO_SYMLINKS
	// would refuse, on every kernel.
	fd, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, Info{}, Stamp{}, fmt.Errorf("%s: %w; name the file itself, or remove the link", path, ErrSymlink)
	}
	if err != nil {
		return nil, Info{}, Stamp{}, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	data, info, stamp, err := readFD(fd, path, max)
	info.DirUID = dst.Uid
	stamp.dirUID = dst.Uid
	return data, info, stamp, err
}

// readFD reads the open descriptor fd (closing it) as Read does; path names
// it in errors.
func readFD(fd int, path string, max int64) ([]byte, Info, Stamp, error) {
	// The descriptor is read and closed as it is, not through an
	// *os.File: that asks the runtime's poller about each file first, and
	// the daemon's scans read a thousand connection files every few
	// seconds.
	defer unix.Close(fd)
	taken := time.Now()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, Info{}, Stamp{}, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	info := Info{UID: st.Uid, Dev: st.Dev, Ino: st.Ino}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, info, Stamp{}, fmt.Errorf("%s: %w (%s); remove it or point gpumem elsewhere", path, ErrNotRegular, kind(st.Mode))
	}
	if st.Size > max {
		return nil, info, Stamp{}, fmt.Errorf("%s: %w: %d bytes, at most %d are read", path, ErrTooLarge, st.Size, max)
	}
	// The size can grow after fstat (a file being written): read one byte
	// past the cap to tell.
	data, err := readUpTo(fd, st.Size, max+1)
	if err != nil {
		return nil, info, Stamp{}, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	if int64(len(data)) > max {
		return nil, info, Stamp{}, fmt.Errorf("%s: %w: more than %d bytes", path, ErrTooLarge, max)
	}
	return data, info, stampOf(&st, taken), nil
}

// readUpTo reads fd to its end or to limit bytes, whichever comes first,
// into a buffer sized for hint bytes (and one more, to see the end) that
// grows as needed.
func readUpTo(fd int, hint, limit int64) ([]byte, error) {
	data := make([]byte, 0, max(min(hint+1, limit), 1))
	for int64(len(data)) < limit {
		if len(data) == cap(data) {
			data = slices.Grow(data, int(min(int64(cap(data)), limit-int64(len(data)))))
		}
		room := data[len(data):min(int64(cap(data)), limit)]
		n, err := unix.Read(fd, room)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		data = data[:len(data)+n]
	}
	return data, nil
}

func kind(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFIFO:
		return "a FIFO"
	case syscall.S_IFCHR:
		return "a character device"
	case syscall.S_IFBLK:
		return "a block device"
	case syscall.S_IFSOCK:
		return "a socket"
	case syscall.S_IFDIR:
		return "a directory"
	}
	return fmt.Sprintf("mode %#o", mode&syscall.S_IFMT)
}
