package procs

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// faultTree is a small fixture /proc: init, a kernel (10) and its child (11).
func faultTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	procstest.WriteTree(t, root, []procstest.Proc{
		{PID: 1, PPID: 0, PGID: 1, SID: 1, Start: 1, Comm: "init", Argv: []string{"init"}},
		{PID: 10, PPID: 1, PGID: 10, SID: 10, UID: 1000, Start: 50, Comm: "kernel", Argv: []string{"python3", "-m", "ipykernel_launcher"},
			Env: []string{"JPY_SESSION_NAME=/nb/a.ipynb"}},
		{PID: 11, PPID: 10, PGID: 10, SID: 10, UID: 1000, Start: 60, Comm: "sleep", Argv: []string{"sleep", "900"}},
	})
	return root
}

// Processes that exit while the scan runs are left out; the scan goes on.
func TestScanSkipsProcessesThatExit(t *testing.T) {
	root := t.TempDir()
	procstest.WriteTree(t, root, []procstest.Proc{
		{PID: 1, PPID: 0, PGID: 1, SID: 1, Start: 1, Comm: "init", Argv: []string{"init"}},
		{PID: 10, PPID: 1, PGID: 10, SID: 10, UID: 1000, Start: 50, Comm: "ok", Argv: []string{"ok"}, Env: []string{"JPY_SESSION_NAME=a.ipynb"}},
		{PID: 11, PPID: 1, PGID: 11, SID: 11, Start: 51, Comm: "nostat", Omit: []string{"stat"}},
		{PID: 15, PPID: 1, PGID: 15, SID: 15, Start: 55, Comm: "gone-after-stat", Omit: []string{"cmdline"}},
		{PID: 16, PPID: 1, PGID: 16, SID: 16, Start: 56, Comm: "vanishes"},
		{PID: 17, PPID: 1, PGID: 17, SID: 17, Start: 57, Comm: "half-vanishes"},
	})
	for _, name := range []string{"self", "0badname"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte("not a pid"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs := &FS{Root: root, lookupUser: testUsers}
	fs.beforeRead = func(pid int) {
		switch pid {
		case 16: // the whole process goes between listing and reading
			_ = os.RemoveAll(filepath.Join(root, "16"))
		case 17: // exits after its stat was written but before status is read
			_ = os.Remove(filepath.Join(root, "17", "status"))
		}
	}
	table, err := fs.Scan()
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	if got := pidsOf(table.All()); !reflect.DeepEqual(got, []int{1, 10}) {
		t.Errorf("pids = %v, want [1 10]", got)
	}
	if p, _ := table.Get(10); p.SessionName != "a.ipynb" || p.User != "alice" {
		t.Errorf("pid 10: %+v", p)
	}
	if _, err := (&FS{Root: filepath.Join(root, "missing")}).Scan(); err == nil {
		t.Error("Scan of a missing root: want an error")
	}
}

// What each error while reading a process's file does to a scan: ENOENT
// and ESRCH say the process exited (left out); EACCES and EPERM say we may
// not look (the process is hidden, or loses only that file); anything else
// fails the scan, which must never read as an exit.
func TestScanFaults(t *testing.T) {
	const (
		skip = "skip" // pid 11 left out, the rest read
		lose = "lose" // pid 11 read without that file
		fail = "fail" // the scan fails, naming the file and the error
	)
	for _, tc := range []struct {
		file string
		err  syscall.Errno
		want string
	}{
		{"", syscall.ENOENT, skip},
		{"", syscall.EMFILE, fail},
		{"", syscall.EACCES, skip},
		{"stat", syscall.ENOENT, skip},
		{"stat", syscall.ESRCH, skip},
		{"stat", syscall.EACCES, skip},
		{"stat", syscall.EPERM, skip},
		{"stat", syscall.EMFILE, fail},
		{"stat", syscall.ENFILE, fail},
		{"stat", syscall.ENOMEM, fail},
		{"stat", syscall.EIO, fail},
		{"status", syscall.ESRCH, skip},
		{"status", syscall.EACCES, lose},
		{"status", syscall.EMFILE, fail},
		{"cmdline", syscall.ENOENT, skip},
		{"cmdline", syscall.EACCES, lose},
		{"cmdline", syscall.ENOMEM, fail},
		{"environ", syscall.ESRCH, skip},
		{"environ", syscall.EACCES, lose},
		{"environ", syscall.EMFILE, fail},
	} {
		name := tc.file
		if name == "" {
			name = "dir"
		}
		t.Run(name+"/"+tc.err.Error(), func(t *testing.T) {
			root := faultTree(t)
			fs := &FS{Root: root, lookupUser: testUsers}
			fs.fault = func(pid int, file string) error {
				if pid == 11 && file == tc.file {
					return tc.err
				}
				return nil
			}
			// Scan reads every file of every process; ScanTree reads the
			// stat of all and the rest of those asked for.
			scans := map[string]func() (*Table, error){
				"Scan":     fs.Scan,
				"ScanTree": func() (*Table, error) { return fs.ScanTree([]int{11}) },
			}
			for scanName, scan := range scans {
				table, err := scan()
				if scanName == "ScanTree" && tc.file == "" {
					// ScanTree's stat pass reads through the root, not the
					// process's directory; its detail pass opens that.
					if tc.want == fail && err == nil {
						t.Errorf("%s: no error", scanName)
					}
					continue
				}
				switch tc.want {
				case fail:
					if err == nil {
						t.Errorf("%s: no error; a table without pid 11 (%v) would say it exited", scanName, pidsOf(table.All()))
						continue
					}
					if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), filepath.Join(root, "11")) {
						t.Errorf("%s: error %q does not name pid 11's file and %v", scanName, err, tc.err)
					}
				case skip:
					if err != nil {
						t.Errorf("%s: %v", scanName, err)
						continue
					}
					if _, ok := table.Get(11); ok && !(scanName == "ScanTree" && tc.file != "stat") {
						t.Errorf("%s: pid 11 listed although /proc said %v", scanName, tc.err)
					}
					if _, ok := table.Get(10); !ok {
						t.Errorf("%s: pid 10 missing", scanName)
					}
				case lose:
					if err != nil {
						t.Errorf("%s: %v", scanName, err)
						continue
					}
					p, ok := table.Get(11)
					if !ok || p.StartTime != 60 {
						t.Errorf("%s: pid 11 = %+v, %v: a file we may not read hid the process", scanName, p, ok)
					}
				}
			}
			if tc.file == "cmdline" {
				_, err := fs.Cmdlines()
				if (err != nil) != (tc.want == fail) {
					t.Errorf("Cmdlines: error %v, want failure %v", err, tc.want == fail)
				}
			}
		})
	}
}

// A file /proc cannot have written fails the scan, naming it.
func TestScanFailsOnMalformedFiles(t *testing.T) {
	for name, tc := range map[string]struct {
		path, content string
		dir           bool
	}{
		"truncated stat": {path: "11/stat", content: "11 (garbage"},
		"another's stat": {path: "11/stat", content: procstest.Proc{PID: 20, PPID: 1, Start: 5}.StatLine()},
		"stat is a dir":  {path: "11/stat", dir: true},
		"status no Uid":  {path: "11/status", content: "Name:\tsleep\n"},
		"pid is a file":  {path: "12", content: "a file, not a directory"},
	} {
		t.Run(name, func(t *testing.T) {
			root := faultTree(t)
			path := filepath.Join(root, tc.path)
			if err := os.RemoveAll(path); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.dir {
				err = os.Mkdir(path, 0o755)
			} else {
				err = os.WriteFile(path, []byte(tc.content), 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = (&FS{Root: root, lookupUser: testUsers}).Scan()
			if err == nil || !strings.Contains(err.Error(), path) {
				t.Errorf("Scan: error %v, want one naming %s", err, path)
			}
		})
	}
}

// Exited confirms an exit only when /proc says so.
func TestExited(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pid    int
		start  uint64
		fault  error
		want   bool
		wantOK bool // no error
	}{
		{"alive", 11, 60, nil, false, true},
		{"pid reused", 11, 59, nil, true, true},
		{"no such pid", 13, 60, nil, true, true},
		{"stat gone", 11, 60, syscall.ESRCH, true, true},
		{"zombie", 12, 70, nil, true, true},
		{"out of descriptors", 11, 60, syscall.EMFILE, false, false},
		{"not allowed to look", 11, 60, syscall.EACCES, false, false},
		{"out of memory", 11, 60, syscall.ENOMEM, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := faultTree(t)
			procstest.WriteTree(t, root, []procstest.Proc{{PID: 12, PPID: 10, PGID: 10, SID: 10, Start: 70, Comm: "worker", State: "Z"}})
			fs := &FS{Root: root}
			fs.fault = func(pid int, file string) error {
				if file == "stat" {
					return tc.fault
				}
				return nil
			}
			got, err := fs.Exited(tc.pid, tc.start)
			if got != tc.want || (err == nil) != tc.wantOK {
				t.Errorf("Exited(%d, %d) = %v, %v; want %v, error %v", tc.pid, tc.start, got, err, tc.want, !tc.wantOK)
			}
			if err != nil && got {
				t.Error("an error reported as an exit")
			}
		})
	}
}
