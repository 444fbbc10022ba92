package procs

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// FileID identifies a file across paths and mount namespaces.
type FileID struct {
	Dev, Ino uint64
}

func statID(path string) (FileID, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return FileID{}, false
	}
	return FileID{Dev: st.Dev, Ino: st.Ino}, true
}

// PathNames reports whether path, as process pid sees it (relative paths
// against its cwd, absolute ones against its root: both through /proc, so a
// process in a container or behind a symlinked dir resolves as it would),
// is the file id. When /proc does not let us look (another user's process
// without root), it falls back to comparing the cleaned path with want.
func (fs *FS) PathNames(pid int, path string, id FileID, want string) bool {
	base := filepath.Join(fs.root(), strconv.Itoa(pid))
	var through string
	if filepath.IsAbs(path) {
		through = filepath.Join(base, "root", path)
	} else {
		through = filepath.Join(base, "cwd", path)
	}
	if got, ok := statID(through); ok {
		return got == id
	}
	return filepath.IsAbs(path) && filepath.Clean(path) == filepath.Clean(want)
}

// HoldsOpen reports whether process pid has the file id open (one of its
// /proc/<pid>/fd entries is that file).
func (fs *FS) HoldsOpen(pid int, id FileID) bool {
	dir := filepath.Join(fs.root(), strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if got, ok := statID(filepath.Join(dir, e.Name())); ok && got == id {
			return true
		}
	}
	return false
}
