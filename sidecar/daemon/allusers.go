package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/gpumem/gpumem/sidecar/discovery"
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

// maxUserDirsPerUID bounds the runtime dirs scanned for one user: any
// directory of theirs that a process's argv names counts as one, and a
// user who starts a thousand processes naming a thousand dirs must not
// cost the daemon a thousand reads at every scan. A user's Jupyter uses
// one or two.
const maxUserDirsPerUID = 16

// addUserDirs, under --all-users, makes every user's runtime dirs found
// now the user dirs the daemon scans: called before each scan, so that a
// user who logs in later is served from the next rescan on, and a dir
// that nothing names any more (its process gone) is forgotten, unless a
// kernel followed has its file there. A dir another daemon holds (the
// user's own gpumem serve) stays that daemon's.
func (d *Daemon) addUserDirs() {
	if !d.cfg.AllUsers || d.deps.UserDirs == nil {
		return
	}
	found, problems := d.deps.UserDirs()
	for _, p := range problems {
		d.problem(p)
	}
	d.mu.Lock()
	inUse := d.disc.locks.usersAmong(d.kernelDirsLocked())
	d.mu.Unlock()
	dirs, dropped := capUserDirs(found, inUse)
	for _, uid := range dropped {
		d.problem(fmt.Errorf("uid %d: its processes name more runtime dirs than the %d scanned for one user: "+
			"the rest are not watched, nor their kernels followed", uid, maxUserDirsPerUID))
	}
	for dir := range inUse {
		dirs = append(dirs, dir)
	}
	byPath := map[string]discovery.UserDir{}
	for _, u := range found {
		byPath[u.Path] = u
	}
	for _, dir := range d.disc.locks.setUsers(dirs) {
		u := byPath[dir]
		d.log.Info().Str("runtime_dir", dir).Uint32("uid", u.UID).Str("found_by", u.From).Msg("watching a user's runtime dir")
	}
}

// capUserDirs keeps at most maxUserDirsPerUID dirs of each uid: those in
// inUse first, then by how they were found (home, then a server's
// environment, then a kernel's argv), then by path. It returns the dirs
// kept and the uids that had dirs dropped.
func capUserDirs(found []discovery.UserDir, inUse map[string]bool) (kept []string, dropped []uint32) {
	rank := func(u discovery.UserDir) int {
		switch {
		case inUse[u.Path]:
			return 0
		case u.From == "home":
			return 1
		case u.From == "server environment":
			return 2
		}
		return 3
	}
	sorted := append([]discovery.UserDir(nil), found...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if ri, rj := rank(sorted[i]), rank(sorted[j]); ri != rj {
			return ri < rj
		}
		return sorted[i].Path < sorted[j].Path
	})
	count := map[uint32]int{}
	for _, u := range sorted {
		if count[u.UID] >= maxUserDirsPerUID && !inUse[u.Path] {
			if !slices.Contains(dropped, u.UID) {
				dropped = append(dropped, u.UID)
			}
			continue
		}
		count[u.UID]++
		kept = append(kept, u.Path)
	}
	return kept, dropped
}

// kernelDirsLocked is the set of dirs holding the connection file of a
// kernel followed. Called with d.mu held.
func (d *Daemon) kernelDirsLocked() map[string]bool {
	dirs := map[string]bool{}
	for file, ks := range d.kernels {
		if ks.pod == nil {
			dirs[filepath.Dir(file)] = true
		}
	}
	return dirs
}
