package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// A write that keeps failing fails with the same text each time (the
// warning's rate limit matches on it) naming the file, never the random
// temporary name, and leaves no temporary file behind.
func TestWriteFileAtomicErrorIsStable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gpumem-alerts.json")
	// A non-empty directory in the file's place: every rename fails.
	if err := os.MkdirAll(filepath.Join(path, "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for range 3 {
		err := writeFileAtomic(path, []byte(`{"alerts":[]}`), 0o600, -1)
		if err == nil {
			t.Fatal("writing over a non-empty directory succeeded")
		}
		if !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.EISDIR) && !errors.Is(err, syscall.ENOTEMPTY) {
			t.Errorf("the system's reason is lost: %v", err)
		}
		msgs = append(msgs, err.Error())
	}
	if msgs[0] != msgs[1] || msgs[1] != msgs[2] {
		t.Errorf("the same failure reads differently each time: %q", msgs)
	}
	if !strings.HasPrefix(msgs[0], path+": rename into place: ") || strings.Contains(msgs[0], "."+filepath.Base(path)+".") {
		t.Errorf("error %q: want the file and the step, not the temporary name", msgs[0])
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

// sharedReport is a shared daemon's report: alice's kernels a1 (GPU 0,
// idle and warned) and a2 (GPU 1), bob's b1 (GPU 0), carol's c1 (GPU 1);
// GPU 0 over the threshold; a process reclaim left running and an
// out-of-memory error, both alice's.
func sharedReport() attribution.Report {
	nb := func(id, user string, gpu int, bytes uint64) attribution.Notebook {
		return attribution.Notebook{KernelID: id, ConnectionFile: "/run/" + id + ".json", Notebook: "/home/" + user + "/" + id + ".ipynb",
			User: user, GPUMemoryBytes: bytes, PerGPU: []attribution.GPUBytes{{Index: gpu, Bytes: bytes}}}
	}
	rep := attribution.Report{
		GPUs: []attribution.GPU{{Index: 0, Name: "H200", MemoryTotalBytes: 80 << 30, MemoryUsedBytes: 70 << 30},
			{Index: 1, Name: "H200", MemoryTotalBytes: 80 << 30, MemoryUsedBytes: 9 << 30}},
		Notebooks: []attribution.Notebook{nb("a1", "alice", 0, 40<<30), nb("a2", "alice", 1, 4<<30),
			nb("b1", "bob", 0, 30<<30), nb("c1", "carol", 1, 5<<30)},
		LeftRunning: []attribution.LeftRunning{{KernelID: "a1", User: "alice", PID: 55, StartTime: 9, GPUs: []int{0}, Bytes: 5,
			Message: "a1's worker left running"}},
	}
	last := uint64(3)
	rep.Notebooks[0].OOM = &attribution.OOMSummary{Count: 1, LastEvent: last, LastHeadline: "a1 ran out of memory"}
	deadline := time.Date(2026, 1, 1, 14, 5, 0, 0, time.UTC)
	attribution.Finish(&rep, attribution.FinishInput{
		Culls: []attribution.CullWarning{{KernelID: "a1", ConnectionFile: "/run/a1.json", User: "alice", Warning: 1,
			Deadline: deadline, Action: attribution.CullShutdown, Bytes: 40 << 30, Idle: time.Hour}},
		Alerts: attribution.AlertConfig{Threshold: 0.8, NameUsers: true},
	})
	return rep
}

// Each user's alert file holds what their view of the report holds, and
// what their kernels show: their kernels' warnings, and a GPU's alert
// listing only their kernels on it (its message names users, never
// notebooks); never another user's kernel, nor a GPU's alert where none of
// their kernels is, nor the kinds notebooks do not show.
func TestUserAlertDocs(t *testing.T) {
	rep := sharedReport()
	cull := notebookAlert{ID: "cull-a1-1", GPU: -1, Kernels: []string{"a1"},
		Message: "this kernel holds 40.0 GiB and has been idle 1 h; it will be shut down at 14:05:00 unless used."}
	gpu0 := func(kernels ...string) notebookAlert {
		return notebookAlert{ID: "gpu0-1", GPU: 0, Kernels: kernels,
			Message: "GPU 0 (H200) is 88% full: 70.0 GiB of 80.0 GiB used; biggest: user alice 40.0 GiB, user bob 30.0 GiB. " +
				"`%gpumem free` returns this notebook's cached memory; `%gpumem top` shows who holds the rest."}
	}
	for _, tc := range []struct {
		name  string
		users map[uint32]string
		want  map[uint32][]notebookAlert
	}{
		{"the warned user: her warning, and the GPU's alert with her kernel on it",
			map[uint32]string{1001: "alice"}, map[uint32][]notebookAlert{1001: {cull, gpu0("a1")}}},
		{"another user on that GPU: the GPU's alert with his kernel only",
			map[uint32]string{1002: "bob"}, map[uint32][]notebookAlert{1002: {gpu0("b1")}}},
		{"a user on another GPU only: no file",
			map[uint32]string{1003: "carol"}, map[uint32][]notebookAlert{}},
		{"a user with no kernel: no file",
			map[uint32]string{1004: "dave"}, map[uint32][]notebookAlert{}},
		{"all at once: each their own",
			map[uint32]string{1001: "alice", 1002: "bob", 1003: "carol", 1004: "dave"},
			map[uint32][]notebookAlert{1001: {cull, gpu0("a1")}, 1002: {gpu0("b1")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs, err := userAlertDocs(rep, tc.users)
			if err != nil {
				t.Fatal(err)
			}
			got := map[uint32][]notebookAlert{}
			for uid, data := range docs {
				var doc struct {
					Alerts []notebookAlert `json:"alerts"`
				}
				if err := json.Unmarshal(data, &doc); err != nil {
					t.Fatalf("uid %d's file %s: %v", uid, data, err)
				}
				got[uid] = doc.Alerts
				for _, other := range rep.Notebooks {
					if other.User != tc.users[uid] && bytes.Contains(data, []byte(`"`+other.KernelID+`"`)) {
						t.Errorf("uid %d (%s)'s file names %s's kernel %s: %s", uid, tc.users[uid], other.User, other.KernelID, data)
					}
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("files\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// The per-user files on disk: a dir of the daemon's, 0711 (reached, never
// listed, by others), each file 0600 and its user's; an earlier run's
// files and an older daemon's one file beside the socket are removed; a
// link planted at a file's name is replaced, never followed; a user with
// no alert left loses the file; a failed write is tried again; a dir
// that is not the daemon's is refused, naming it.
func TestAlertFilesSync(t *testing.T) {
	base := t.TempDir()
	self := uint32(os.Geteuid())
	other := int(self) // as root the file is given to another uid
	if self == 0 {
		other = 4242
	}
	l := alertLayout{private: filepath.Join(base, alertFileName), dir: filepath.Join(base, alertDirName), uid: self}
	mine, theirs := filepath.Join(l.dir, fmt.Sprint(self)+".json"), filepath.Join(l.dir, fmt.Sprint(other)+".json")
	stale := filepath.Join(l.dir, "1234.json")
	victim := filepath.Join(base, "victim")
	for path, data := range map[string]string{l.private: "old, every user's", victim: "precious"} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(l.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("an earlier run's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, theirs); err != nil {
		t.Fatal(err)
	}
	var a alertFiles
	want := map[string]alertContent{mine: {data: []byte(`{"alerts":[1]}`), owner: int(self)},
		theirs: {data: []byte(`{"alerts":[2]}`), owner: other}}
	if errs := a.sync(l, want); len(errs) != 0 {
		t.Fatal(errs)
	}
	owned := func(path string, mode os.FileMode, uid int) {
		t.Helper()
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode() != mode || int(st.Uid) != uid {
			t.Errorf("%s: %v of uid %d, want %v of uid %d", path, fi.Mode(), st.Uid, mode, uid)
		}
	}
	owned(l.dir, os.ModeDir|alertDirMode, int(self))
	owned(mine, 0o600, int(self))
	owned(theirs, 0o600, other)
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Errorf("the file behind the planted link now holds %q", b)
	}
	for _, gone := range []string{stale, l.private} {
		if _, err := os.Lstat(gone); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there: %v", gone, err)
		}
	}

	// The other user's alerts end: their file goes, mine stays.
	delete(want, theirs)
	if errs := a.sync(l, want); len(errs) != 0 {
		t.Fatal(errs)
	}
	if _, err := os.Lstat(theirs); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file of a user with no alert left: %v, want it gone", err)
	}
	// A write that fails is tried again, though the content did not change.
	want[theirs] = alertContent{data: []byte(`{"alerts":[3]}`), owner: other}
	if err := os.MkdirAll(filepath.Join(theirs, "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	if errs := a.sync(l, want); len(errs) != 1 || !strings.Contains(errs[0].Error(), theirs) {
		t.Fatalf("writing over a directory: %v, want one error naming %s", errs, theirs)
	}
	if err := os.RemoveAll(theirs); err != nil {
		t.Fatal(err)
	}
	if errs := a.sync(l, want); len(errs) != 0 {
		t.Fatal(errs)
	}
	if b, err := os.ReadFile(theirs); err != nil || string(b) != `{"alerts":[3]}` {
		t.Errorf("after the failed write: %q, %v", b, err)
	}

	// A dir that is a link is refused, naming it; what it names is untouched.
	if err := os.RemoveAll(l.dir); err != nil {
		t.Fatal(err)
	}
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, l.dir); err != nil {
		t.Fatal(err)
	}
	want[mine] = alertContent{data: []byte(`{"alerts":[4]}`), owner: int(self)}
	errs := a.sync(l, want)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), l.dir+" is not a directory of uid") {
		t.Errorf("a linked dir: %v, want it refused by name", errs)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("files written through the linked dir: %v", entries)
	}
}
