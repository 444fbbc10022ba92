package daemon

import (
	"errors"
	"os"
)

// errAllUsersNotRoot: only root can read other users' runtime dirs and
// connection files.
var errAllUsersNotRoot = errors.New("--all-users needs root: only root may read other users' runtime dirs and connection keys")

func checkAllUsers(cfg Config) error {
	if cfg.AllUsers && os.Geteuid() != 0 {
		return errAllUsersNotRoot
	}
	return nil
}

// addUserDirs, under --all-users, adds every user's runtime dirs found now
// to those the daemon locks and scans: called before each scan, so a user
// who logs in later is served from the next rescan on. A dir another
// daemon holds (the user's own gpumem serve) stays that daemon's.
func (d *Daemon) addUserDirs() {
	if !d.cfg.AllUsers || d.userDirs == nil {
		return
	}
	found, problems := d.userDirs()
	for _, p := range problems {
		d.problem(p)
	}
	for _, u := range found {
		if d.locks.add(u.Path) {
			d.log.Info().Str("runtime_dir", u.Path).Uint32("uid", u.UID).Str("found_by", u.From).Msg("watching a user's runtime dir")
		}
	}
}

// add makes dir one of the dirs to lock and scan; it reports whether it
// was new.
func (l *dirLocks) add(dir string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range l.dirs {
		if d == dir {
			return false
		}
	}
	l.dirs = append(l.dirs, dir)
	return true
}
