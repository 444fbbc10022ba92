package safefile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNotOwner is returned for a file that is not the expected user's.
var ErrNotOwner = errors.New("not the caller's file")

// OpenOwned opens the regular file at the absolute path, owned by uid and
// at most max bytes, for reading, and returns it open (the caller closes
// it): a file a user hands the daemon (a memory snapshot), which the
// daemon, maybe root, must read only if that user could. No component of
// path may be a symlink (the user controls the directories), and nothing
// is opened for reading before its type and owner are checked: the path
// is first opened O_PATH (which opens no device), checked, then reopened
// through that descriptor.
func OpenOwned(path string, uid uint32, max int64) (*os.File, Info, error) {
	if !filepath.IsAbs(path) {
		return nil, Info{}, fmt.Errorf("%s: not an absolute path", path)
	}
	pfd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, Info{}, fmt.Errorf("%s: a component of the path is a symlink: give the file's real path (os.path.realpath)", path)
		}
		return nil, Info{}, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, Info{}, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	info := Info{UID: st.Uid, Dev: st.Dev, Ino: st.Ino}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, info, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, kind(st.Mode))
	}
	if st.Uid != uid {
		return nil, info, fmt.Errorf("%s: %w: it belongs to uid %d, not %d", path, ErrNotOwner, st.Uid, uid)
	}
	if st.Size > max {
		return nil, info, fmt.Errorf("%s: %w: %d bytes, at most %d are read", path, ErrTooLarge, st.Size, max)
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, info, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil || st2.Dev != st.Dev || st2.Ino != st.Ino {
		unix.Close(fd)
		return nil, info, fmt.Errorf("%s: the file changed while it was opened", path)
	}
	return os.NewFile(uintptr(fd), path), info, nil
}
