package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// Under --all-users every scan asks for the users' dirs again: a dir that
// appears later (a user logging in) is scanned from then on, logged once,
// but locked only while a kernel in it is followed; a dir nothing names
// any more is forgotten, unless a followed kernel's file is there. The
// finder's problems are logged.
func TestAllUsersDirsLastAsLongAsSomethingNamesThem(t *testing.T) {
	r := newRig(t, Config{})
	later := filepath.Join(t.TempDir(), "runtime")
	if err := os.MkdirAll(later, 0o700); err != nil {
		t.Fatal(err)
	}
	calls := 0
	found := []discovery.UserDir{{Path: later, UID: 1000, From: "home"}}
	r.d.cfg.AllUsers = true // New demands root for it; the rig runs as anyone
	r.d.deps.UserDirs = func() ([]discovery.UserDir, []error) {
		calls++
		if calls == 1 {
			return nil, []error{errors.New("runtime dir /x (home of uid 5) belongs to uid 6: not watched")}
		}
		return found, nil
	}
	watched := func() []string {
		r.d.disc.locks.mu.Lock()
		defer r.d.disc.locks.mu.Unlock()
		return append(slices.Clone(r.d.disc.locks.own), r.d.disc.locks.users...)
	}
	held := func() bool {
		r.d.disc.locks.mu.Lock()
		defer r.d.disc.locks.mu.Unlock()
		return r.d.disc.locks.held[later] != nil
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
	if held() {
		t.Errorf("%s locked with no kernel followed in it", later)
	}
	if n := strings.Count(r.logs.String(), "watching a user's runtime dir"); n != 1 {
		t.Errorf("logged the new dir %d times, want once:\n%s", n, r.logs)
	}

	// A kernel of ours starts in it: followed, and the dir locked while it
	// is, even once nothing names the dir any more.
	r.setProcs(procstest.Proc{PID: 100, PPID: 1, PGID: 100, SID: 100})
	file := filepath.Join(later, "kernel-k.json")
	if err := os.WriteFile(file, []byte(`{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.owners[file] = discovery.Owner{PID: 100, Start: 100, FromPort: true, UIDMatch: true, Proven: true}
	r.mu.Unlock()
	r.d.scan(r.ctx)
	if r.kernel(file) == nil || !held() {
		t.Fatalf("kernel in a user dir: followed %v, dir locked %v", r.kernel(file) != nil, held())
	}
	found = nil
	r.d.scan(r.ctx)
	if !slices.Contains(watched(), later) || !held() {
		t.Fatalf("the dir of a followed kernel was forgotten: watched %v", watched())
	}
	// The kernel goes (its file and its process): the dir is forgotten.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	r.exit(100)
	testenv.Poll(t, 10*time.Second, "the kernel forgotten", func() bool {
		r.d.scan(r.ctx)   // the file is gone: detached
		r.d.sample(r.ctx) // the process is gone: over
		return r.kernel(file) == nil
	})
	r.d.scan(r.ctx)
	if slices.Contains(watched(), later) || held() {
		t.Errorf("a dir nothing names is still watched (%v) or locked (%v)", watched(), held())
	}
	if r.d.disc.locks.heldCount() != 1 {
		t.Errorf("%d dirs locked, want the own one only", r.d.disc.locks.heldCount())
	}
}

// Each user's dirs are capped: the dirs of followed kernels first, then
// home, a server's environment, a kernel's argv.
func TestCapUserDirs(t *testing.T) {
	var found []discovery.UserDir
	for i := range maxUserDirsPerUID + 5 {
		found = append(found, discovery.UserDir{Path: fmt.Sprintf("/a/argv%02d", i), UID: 7, From: "kernel argv"})
	}
	found = append(found, discovery.UserDir{Path: "/a/home", UID: 7, From: "home"},
		discovery.UserDir{Path: "/a/server", UID: 7, From: "server environment"},
		discovery.UserDir{Path: "/b/home", UID: 8, From: "home"})
	inUse := map[string]bool{"/a/argv20": true}
	kept, dropped := capUserDirs(found, inUse)
	a := 0
	for _, d := range kept {
		if strings.HasPrefix(d, "/a/") {
			a++
		}
	}
	if a != maxUserDirsPerUID {
		t.Errorf("uid 7 keeps %d dirs, want %d", a, maxUserDirsPerUID)
	}
	for _, want := range []string{"/a/argv20", "/a/home", "/a/server", "/b/home", "/a/argv00"} {
		if !slices.Contains(kept, want) {
			t.Errorf("%s dropped; kept %v", want, kept)
		}
	}
	if slices.Contains(kept, "/a/argv19") {
		t.Errorf("kept an argv dir past the cap: %v", kept)
	}
	if !slices.Equal(dropped, []uint32{7}) {
		t.Errorf("dropped uids %v, want [7]", dropped)
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
