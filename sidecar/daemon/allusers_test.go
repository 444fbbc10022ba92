package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/sidecar/discovery"
)

// Under --all-users every scan asks for the users' dirs again: a dir that
// appears later (a user logging in) is locked and scanned from then on,
// once; the finder's problems are logged.
func TestAllUsersAddsDirsAtScan(t *testing.T) {
	r := newRig(t, Config{})
	later := filepath.Join(t.TempDir(), "runtime")
	if err := os.MkdirAll(later, 0o700); err != nil {
		t.Fatal(err)
	}
	calls := 0
	r.d.cfg.AllUsers = true // New demands root for it; the rig runs as anyone
	r.d.userDirs = func() ([]discovery.UserDir, []error) {
		calls++
		if calls == 1 {
			return nil, []error{errors.New("runtime dir /x (home of uid 5) belongs to uid 6: not watched")}
		}
		return []discovery.UserDir{{Path: later, UID: 1000, From: "home"}}, nil
	}
	watched := func() []string {
		r.d.locks.mu.Lock()
		defer r.d.locks.mu.Unlock()
		return slices.Clone(r.d.locks.dirs)
	}

	r.d.scan(r.ctx)
	if slices.Contains(watched(), later) {
		t.Fatalf("%s watched before the finder returned it", later)
	}
	r.waitLog("belongs to uid 6: not watched")

	r.d.scan(r.ctx)
	r.d.scan(r.ctx)
	if got := watched(); !slices.Contains(got, later) || !slices.Contains(got, r.dir) {
		t.Fatalf("watched %v, want %s and %s", got, r.dir, later)
	}
	r.d.locks.mu.Lock()
	held := r.d.locks.held[later] != nil
	r.d.locks.mu.Unlock()
	if !held {
		t.Errorf("%s not locked", later)
	}
	if n := strings.Count(r.logs.String(), "watching a user's runtime dir"); n != 1 {
		t.Errorf("logged the new dir %d times, want once:\n%s", n, r.logs)
	}
	if calls != 3 {
		t.Errorf("finder called %d times in 3 scans", calls)
	}
}

func TestAllUsersNeedsRoot(t *testing.T) {
	err := checkAllUsers(Config{AllUsers: true})
	if os.Geteuid() == 0 {
		if err != nil {
			t.Errorf("as root: %v", err)
		}
		return
	}
	if !errors.Is(err, errAllUsersNotRoot) {
		t.Errorf("not root: %v, want errAllUsersNotRoot", err)
	}
}
