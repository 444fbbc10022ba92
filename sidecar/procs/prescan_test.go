package procs

import (
	"reflect"
	"testing"

	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// A Prescan's ScanTree equals a fresh ScanTree; a detail pid the prescan
// did not see (a process started since) makes it scan afresh.
func TestPrescanEqualsScanTree(t *testing.T) {
	root := kernelsRoot(t)
	fs := &FS{Root: root, lookupUser: testUsers}
	pre := fs.Prescan()
	for _, details := range [][]int{nil, {1000}, {1000, 1001, 4000}} {
		want, err := fs.ScanTree(details)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pre.ScanTree(details)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.All(), want.All()) {
			t.Errorf("details %v:\n got %+v\nwant %+v", details, got.All(), want.All())
		}
	}
	// Reading details leaves the prescan as it was.
	if again, _ := pre.ScanTree(nil); func() bool { p, _ := again.Get(1000); return p.Detailed }() {
		t.Error("details read for one ScanTree stayed in the prescan")
	}

	// A process that starts after the prescan.
	tmp := t.TempDir()
	procstest.WriteTree(t, tmp, []procstest.Proc{{PID: 1, Comm: "init", Argv: []string{"/sbin/init"}, Start: 1}})
	fs = &FS{Root: tmp, lookupUser: testUsers}
	pre = fs.Prescan()
	procstest.WriteTree(t, tmp, []procstest.Proc{{PID: 77, PPID: 1, Comm: "python3", Argv: []string{"python3", "train.py"}, Start: 9}})
	table, err := pre.ScanTree([]int{77})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := table.Get(77); !ok || !p.Detailed || p.PPID != 1 {
		t.Errorf("a process started after the prescan: %+v, %v", p, ok)
	}

	// A prescan of a root that cannot be read scans afresh (and fails as
	// a fresh scan does).
	bad := (&FS{Root: t.TempDir() + "/missing"}).Prescan()
	if _, err := bad.ScanTree([]int{1}); err == nil {
		t.Error("a missing root scanned")
	}
}
