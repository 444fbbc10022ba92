package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// The notebook alert files on disk: what the daemon wrote, each file
// replaced only when its content changes, and a shared daemon's dir of one
// file per user, which only the daemon may write or list.

// alertFiles is what the daemon wrote of its alert files (the sampling
// goroutine's own, like sampleFailures).
type alertFiles struct {
	// written is, by path, the content of each file written and not
	// removed since.
	written map[string][]byte
	// swept: the per-user dir was cleared of the files this run did not
	// write (a daemon that stopped without removing them).
	swept bool
}

// alertContent is one alert file as it should be.
type alertContent struct {
	data  []byte
	owner int // the uid it is given to; -1: the daemon's own
}

// alertLayout is where the alert files lie.
type alertLayout struct {
	// private is the one file beside the socket: a private daemon's, and
	// for a shared one an older daemon's to remove (that one was 0644, for
	// every user's kernels).
	private string
	// dir holds a shared daemon's per-user files; "" for a private daemon.
	dir string
	uid uint32 // the daemon's, who owns dir
}

// alertDirMode lets every user reach their own file by name, and no one
// but the daemon list or change what is there.
const alertDirMode = 0o711

// sync makes the files under l what want says: each file whose content
// changed written anew (0600, given to its owner), each file written
// before and no longer wanted removed. It returns one error per file that
// failed; the rest are done.
func (a *alertFiles) sync(l alertLayout, want map[string]alertContent) []error {
	changed := l.dir != "" && !a.swept
	for path, c := range want {
		if old, ok := a.written[path]; !ok || !bytes.Equal(old, c.data) {
			changed = true
		}
	}
	for path := range a.written {
		if _, ok := want[path]; !ok {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	var errs []error
	if l.dir != "" {
		if err := prepareAlertDir(l.dir, l.uid); err != nil {
			return []error{err}
		}
		if !a.swept {
			errs = append(errs, sweepAlertDir(l, want)...)
			a.swept = true
		}
	}
	if a.written == nil {
		a.written = map[string][]byte{}
	}
	for _, path := range slices.Sorted(maps.Keys(want)) {
		c := want[path]
		if old, ok := a.written[path]; ok && bytes.Equal(old, c.data) {
			continue
		}
		if err := writeFileAtomic(path, c.data, 0o600, c.owner); err != nil {
			hint := ""
			if errors.Is(err, fs.ErrPermission) && c.owner >= 0 && uint32(c.owner) != l.uid {
				hint = " (giving each user an alert file of their own takes CAP_CHOWN: add it to the daemon's capabilities)"
			}
			errs = append(errs, fmt.Errorf("writing the notebook alert file: %w%s", err, hint))
			continue
		}
		a.written[path] = c.data
	}
	for _, path := range slices.Sorted(maps.Keys(a.written)) {
		if _, ok := want[path]; ok {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing the notebook alert file of a user with no alert left: %w", err))
			continue
		}
		delete(a.written, path)
	}
	return errs
}

// prepareAlertDir makes dir, the per-user files' dir, or checks the one
// there: a directory (not a link) of uid, mode alertDirMode.
func prepareAlertDir(dir string, uid uint32) error {
	if err := os.Mkdir(dir, alertDirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("making the notebook alert dir: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("the notebook alert dir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || st.Uid != uid {
		return fmt.Errorf("the notebook alert dir %s is not a directory of uid %d (the daemon's): remove it, and gpumem serve makes it anew", dir, uid)
	}
	if fi.Mode().Perm() != alertDirMode {
		if err := os.Chmod(dir, alertDirMode); err != nil {
			return fmt.Errorf("the notebook alert dir: %w", err)
		}
	}
	return nil
}

// sweepAlertDir removes what l's dir holds that want does not (files an
// earlier run left: their alerts no longer stand), and an older daemon's
// one file beside the socket. Removing a link removes the link, never what
// it names.
func sweepAlertDir(l alertLayout, want map[string]alertContent) []error {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return []error{fmt.Errorf("listing the notebook alert dir: %w", err)}
	}
	stale := []string{l.private}
	for _, e := range entries {
		if p := filepath.Join(l.dir, e.Name()); want[p].data == nil {
			stale = append(stale, p)
		}
	}
	var errs []error
	for _, p := range stale {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing a stale notebook alert file: %w", err))
		}
	}
	return errs
}
