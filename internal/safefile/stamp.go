package safefile

import (
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stamp is what a stat tells of a file without reading it: its identity,
// owner, type and permissions, link count, size and times, and its dir's
// owner. A reader that keeps what it parsed of a file can ask Unchanged
// instead of reading the file again.
type Stamp struct {
	dev, ino     uint64
	uid, dirUID  uint32
	mode         uint32
	nlink        uint64
	size         int64
	mtime, ctime unix.Timespec
	// settled: the file's last change was over stampMargin before the
	// stamp was taken (see Unchanged).
	settled bool
}

// stampMargin is how long before a stamp the file's last change must be
// for the stamp to vouch for its bytes. The kernel stamps a change with a
// clock that advances by ticks, so two writes within one tick carry the
// same times: a file read between them and stamped then would look
// unchanged after the second ("racy git"). A change after the stamp
// carries a time later than the stamp less a tick, so it cannot equal a
// change time older than the margin.
const stampMargin = time.Second

func stampOf(st *unix.Stat_t, taken time.Time) Stamp {
	return Stamp{dev: st.Dev, ino: st.Ino, uid: st.Uid, mode: st.Mode, nlink: uint64(st.Nlink), size: st.Size,
		mtime: st.Mtim, ctime: st.Ctim,
		settled: time.Unix(st.Ctim.Unix()).Before(taken.Add(-stampMargin)) &&
			time.Unix(st.Mtim.Unix()).Before(taken.Add(-stampMargin))}
}

// Unchanged reports whether path is still, by a stat of it (a link in its
// place is not followed) and of its dir, the very file s was taken of with
// every figure as it was: then its bytes are the ones read with s. A stamp
// taken within stampMargin of the file's last change vouches for nothing,
// nor does a failed stat: both answer false, and the caller reads the file.
// Any write, rename over, chmod, chown or new link changes the change time,
// and no user can set it back.
func (s Stamp) Unchanged(path string) bool {
	if !s.settled {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstatat(unix.AT_FDCWD, path, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return false
	}
	now := stampOf(&st, time.Time{})
	now.settled, now.dirUID = true, s.dirUID
	if now != s {
		return false
	}
	dir := filepath.Dir(path)
	var dst unix.Stat_t
	return unix.Stat(dir, &dst) == nil && dst.Uid == s.dirUID
}
