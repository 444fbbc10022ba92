package safefile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A container's files are read by the daemon through the container's root
// (/proc/<pid>/root). A plain open of "/proc/<pid>/root/<path>" would follow
// an absolute symlink inside the container against the daemon's own root:
// a container could make the daemon read any host file. Opening relative to
// a descriptor of that root with openat2(RESOLVE_IN_ROOT) resolves every
// component, ".." and symlinks included, as the container sees them, never
// leaving the root; RESOLVE_NO_MAGICLINKS refuses /proc-style links
// (/proc/self/root/...) that would jump elsewhere.

// resolveInRoot are the openat2 resolve flags for a path inside a root.
const resolveInRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// ReadInRoot is Read of path resolved inside the directory rootFD (a
// descriptor of /proc/<pid>/root): as a process chrooted there would
// resolve it. Errors name the path as root's.
func ReadInRoot(rootFD int, rootName, path string, max int64) ([]byte, Info, error) {
	name := filepath.Join(rootName, path)
	fd, err := unix.Openat2(rootFD, path, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY,
		Resolve: resolveInRoot,
	})
	if err != nil {
		return nil, Info{}, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	data, info, _, err := readFD(fd, name, max)
	return data, info, err
}

// ListInRoot returns the names in directory dir resolved inside rootFD (see
// ReadInRoot).
func ListInRoot(rootFD int, rootName, dir string) ([]string, error) {
	name := filepath.Join(rootName, dir)
	fd, err := unix.Openat2(rootFD, dir, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: resolveInRoot,
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return names, nil
}
