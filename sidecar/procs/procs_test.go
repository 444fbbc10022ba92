package procs

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

var update = flag.Bool("update", false, "rewrite testdata/proc-kernels from kernelsFixture")

// kernelsFixture is a box with Jupyter kernels (testdata/proc-kernels):
//
//	1 init ─┬─ 500 jupyter-notebook ─┬─ 1000 kernel A (sid=pgid=1000)
//	        │                        │     ├─ 1001 ─ 1002 ─ 1003 ─ 1004 ─ 1005 ─ 1006 (deep tree)
//	        │                        │     └─ 1010 setsid() child (sid=pgid=1010)
//	        │                        └─ 3000 pid of dead kernel C, reused (start 9000)
//	        │                              └─ 3001
//	        ├─ 2001 orphan of killed kernel B (sid=pgid=2000) ─ 2002
//	        ├─ 600 subreaper ─ 2003 orphan of kernel B (sid=pgid=2000)
//	        ├─ 4000 unrelated GPU job (bob)
//	        ├─ 1500 stale member of session 2000 older than kernel B (start 10)
//	        └─ 5000 container init (NSpid 5000 1) ─ 5001 kernel in container (NSpid 5001 7)
//	2 kthreadd ─ 3 kworker (no cmdline)
var kernelsFixture = []procstest.Proc{
	{PID: 1, PPID: 0, PGID: 1, SID: 1, Start: 1, Comm: "systemd", Argv: []string{"/sbin/init"}},
	{PID: 2, PPID: 0, PGID: 0, SID: 0, Start: 1, Comm: "kthreadd"},
	{PID: 3, PPID: 2, PGID: 0, SID: 0, Start: 2, Comm: "kworker/0:0-events"},
	{PID: 500, PPID: 1, PGID: 500, SID: 500, UID: 1000, Start: 100, Comm: "jupyter-noteboo",
		Argv: []string{"/usr/bin/python3", "/usr/bin/jupyter-notebook", "--no-browser"}},
	{PID: 1000, PPID: 500, PGID: 1000, SID: 1000, UID: 1000, Start: 2000, Comm: "python3",
		Argv:    []string{"/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "/run/user/1000/jupyter/kernel-aaaa.json"},
		Env:     []string{"JPY_PARENT_PID=500", "JPY_SESSION_NAME=/home/alice/train (1).ipynb"},
		Sockets: []uint64{31001, 31002}},
	{PID: 1001, PPID: 1000, PGID: 1000, SID: 1000, UID: 1000, Start: 2100, Comm: "pt_data_worker", Argv: []string{"/usr/bin/python3", "-c", "worker"},
		Env: []string{"JPY_SESSION_NAME=/home/alice/train (1).ipynb"}, Sockets: []uint64{31001}},
	{PID: 1002, PPID: 1001, PGID: 1000, SID: 1000, UID: 1000, Start: 2101, Comm: "sh", Argv: []string{"sh", "-c", "deep"}},
	{PID: 1003, PPID: 1002, PGID: 1003, SID: 1000, UID: 1000, Start: 2102, Comm: "bash", Argv: []string{"bash"}},
	{PID: 1004, PPID: 1003, PGID: 1004, SID: 1000, UID: 1000, Start: 2103, Comm: "make", Argv: []string{"make", "-j"}},
	{PID: 1005, PPID: 1004, PGID: 1004, SID: 1000, UID: 1000, Start: 2104, Comm: "cc1 (x) )", Argv: []string{"cc1", "weird comm"}},
	{PID: 1006, PPID: 1005, PGID: 1004, SID: 1000, UID: 1000, Start: 2105, Comm: "as", Argv: []string{"as"}},
	{PID: 1010, PPID: 1000, PGID: 1010, SID: 1010, UID: 1000, Start: 2200, Comm: "ray", Argv: []string{"ray::worker"}},
	{PID: 2001, PPID: 1, PGID: 2000, SID: 2000, UID: 1000, Start: 3100, Comm: "python3", Argv: []string{"python3", "pool.py"}},
	{PID: 2002, PPID: 2001, PGID: 2002, SID: 2002, UID: 1000, Start: 3101, Comm: "python3", Argv: []string{"python3", "grandchild"}},
	{PID: 600, PPID: 1, PGID: 600, SID: 600, UID: 1000, Start: 150, Comm: "systemd", Argv: []string{"/lib/systemd/systemd", "--user"}},
	{PID: 2003, PPID: 600, PGID: 2000, SID: 2000, UID: 1000, Start: 3102, Comm: "python3", Argv: []string{"python3", "-c", "cuda"}},
	{PID: 1500, PPID: 1, PGID: 2000, SID: 2000, UID: 1000, Start: 10, Comm: "stale", Argv: []string{"stale"}},
	{PID: 3000, PPID: 500, PGID: 500, SID: 500, UID: 1000, Start: 9000, Comm: "sleep", Argv: []string{"sleep", "100"}},
	{PID: 3001, PPID: 3000, PGID: 500, SID: 500, UID: 1000, Start: 9001, Comm: "sleep", Argv: []string{"sleep", "1"}},
	{PID: 4000, PPID: 1, PGID: 4000, SID: 4000, UID: 1001, Start: 4000, Comm: "python3", Argv: []string{"python3", "train.py", "--epochs", "10"}},
	{PID: 5000, PPID: 1, PGID: 5000, SID: 5000, UID: 0, Start: 5000, Comm: "tini", Argv: []string{"tini", "--"}, NSpid: []int{5000, 1}},
	{PID: 5001, PPID: 5000, PGID: 5001, SID: 5001, UID: 1000, Start: 5001, Comm: "python3",
		Argv: []string{"python3", "-m", "ipykernel_launcher"}, NSpid: []int{5001, 7}},
}

var kernelsListening = map[int]uint64{52001: 31001, 52002: 31002, 8888: 30000}

func testUsers(uid uint32) (string, error) {
	switch uid {
	case 0:
		return "root", nil
	case 1000:
		return "alice", nil
	case 1001:
		return "bob", nil
	}
	return "", errors.New("unknown uid")
}

func kernelsRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join("testdata", "proc-kernels")
	if *update {
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
		procstest.WriteTree(t, root, kernelsFixture)
		procstest.WriteNet(t, root, kernelsListening, map[int]uint64{52003: 31003})
	}
	if _, err := os.Stat(root); err != nil {
		t.Fatalf("%v: run go test ./sidecar/procs -run %s -update", err, t.Name())
	}
	return root
}

func scanFixture(t *testing.T, root string) *Table {
	t.Helper()
	fs := &FS{Root: root, lookupUser: testUsers}
	table, err := fs.Scan()
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return table
}

func pidsOf(procs []Proc) []int {
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = p.PID
	}
	return pids
}

func TestScanKernelsFixture(t *testing.T) {
	table := scanFixture(t, kernelsRoot(t))
	if table.Len() != len(kernelsFixture) {
		t.Fatalf("Len = %d, want %d", table.Len(), len(kernelsFixture))
	}
	got, ok := table.Get(1000)
	if !ok {
		t.Fatal("kernel 1000 missing")
	}
	want := Proc{PID: 1000, PPID: 500, PGID: 1000, SID: 1000, UID: 1000, User: "alice", StartTime: 2000, Comm: "python3", State: 'S', Detailed: true,
		Argv:        []string{"/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "/run/user/1000/jupyter/kernel-aaaa.json"},
		SessionName: "/home/alice/train (1).ipynb", NSpid: []int{1000}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Get(1000):\n got %+v\nwant %+v", got, want)
	}
	if p, _ := table.Get(1005); p.Comm != "cc1 (x) )" || p.PPID != 1004 || p.StartTime != 2104 {
		t.Errorf("comm with parentheses: %+v", p)
	}
	if p, _ := table.Get(3); p.Argv != nil || p.Comm != "kworker/0:0-events" || p.User != "root" {
		t.Errorf("kernel thread: %+v", p)
	}
	if p, _ := table.Get(4000); p.User != "bob" || p.SessionName != "" {
		t.Errorf("unrelated process: %+v", p)
	}
	if pids := pidsOf(table.All()); !slices.IsSorted(pids) {
		t.Errorf("All() not sorted by PID: %v", pids)
	}
	if got := pidsOf(table.Children(1000)); !reflect.DeepEqual(got, []int{1001, 1010}) {
		t.Errorf("Children(1000) = %v", got)
	}
}

func TestKernelProcesses(t *testing.T) {
	// The tree needs stat alone: ScanTree must give the same answers.
	full := scanFixture(t, kernelsRoot(t))
	tree, err := (&FS{Root: kernelsRoot(t)}).ScanTree(nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		pid   int
		start uint64
		want  []int
	}{
		{"live kernel: deep tree and setsid child", 1000, 2000, []int{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1010}},
		{"start unknown", 1000, 0, []int{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1010}},
		{"wrong Start: a reused pid is not the kernel", 1000, 1999, nil},
		{"killed kernel: orphans reparented to init and to a subreaper, with their children", 2000, 3000, []int{2001, 2002, 2003}},
		{"killed kernel, start unknown: older session members too", 2000, 0, []int{1500, 2001, 2002, 2003}},
		{"pid reused by an unrelated process", 3000, 5000, nil},
		{"no such process", 7777, 7000, nil},
		{"invalid pid", 0, 0, nil},
		{"process group of a non-leader", 1004, 2103, []int{1004, 1005, 1006}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for name, table := range map[string]*Table{"Scan": full, "ScanTree": tree} {
				got := pidsOf(table.KernelProcesses(tt.pid, tt.start))
				if len(got) == 0 && len(tt.want) == 0 {
					continue
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("%s: KernelProcesses(%d, %d) = %v, want %v", name, tt.pid, tt.start, got, tt.want)
				}
			}
		})
	}
}

func TestLookupIdentity(t *testing.T) {
	table := scanFixture(t, kernelsRoot(t))
	if _, ok := table.Lookup(3000, 9000); !ok {
		t.Error("Lookup(3000, 9000): the current process is not found")
	}
	if p, ok := table.Lookup(3000, 5000); ok {
		t.Errorf("Lookup(3000, 5000) = %+v: an old process confused with the pid's new owner", p)
	}
	if _, ok := table.Lookup(3000, 0); !ok {
		t.Error("Lookup(3000, 0): unknown start time should match")
	}
}

func TestNamespaces(t *testing.T) {
	table := scanFixture(t, kernelsRoot(t))
	if local, ok := table.HostToLocal(5001); !ok || local != 7 {
		t.Errorf("HostToLocal(5001) = %d, %v; want 7", local, ok)
	}
	if local, ok := table.HostToLocal(1000); !ok || local != 1000 {
		t.Errorf("HostToLocal(1000) = %d, %v; want 1000 (same namespace)", local, ok)
	}
	if _, ok := table.HostToLocal(9999); ok {
		t.Error("HostToLocal(9999) ok for a missing pid")
	}
	if host, ok := table.LocalToHost(7); !ok || host != 5001 {
		t.Errorf("LocalToHost(7) = %d, %v; want 5001", host, ok)
	}
	// Resolve: a pid of the table wins; else the one process with that inner pid.
	if p, ok := table.Resolve(7); !ok || p.PID != 5001 {
		t.Errorf("Resolve(7) = %+v, %v", p, ok)
	}
	if p, ok := table.Resolve(1); !ok || p.PID != 1 {
		t.Errorf("Resolve(1) = %+v, %v (init of this namespace, not the container's)", p, ok)
	}
	if _, ok := table.Resolve(12345); ok {
		t.Error("Resolve(12345) ok")
	}
	// Two containers with the same inner PID: ambiguous, so not mapped.
	amb := NewTable([]Proc{{PID: 10, NSpid: []int{10, 3}}, {PID: 11, NSpid: []int{11, 3}}})
	if _, ok := amb.LocalToHost(3); ok {
		t.Error("LocalToHost(3) mapped an ambiguous inner pid")
	}
}

func TestListeningAndSocketOwners(t *testing.T) {
	root := kernelsRoot(t)
	fs := &FS{Root: root}
	ports, err := fs.ListeningTCPPorts()
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]uint64{52001: 31001, 52002: 31002, 8888: 30000, 52003: 31003}
	if !reflect.DeepEqual(firstInodes(ports), want) {
		t.Errorf("ports = %v, want %v", ports, want)
	}
	owners, err := fs.SocketOwners([]uint64{31001, 31002, 31003, 30000})
	if err != nil {
		t.Fatal(err)
	}
	// 31001 is shared with child 1001 (inherited fd): the lower pid wins.
	if wantOwners := map[uint64]int{31001: 1000, 31002: 1000}; !reflect.DeepEqual(owners, wantOwners) {
		t.Errorf("owners = %v, want %v", owners, wantOwners)
	}
	if o, err := fs.SocketOwners(nil); err != nil || len(o) != 0 {
		t.Errorf("SocketOwners(nil) = %v, %v", o, err)
	}
}

func TestListeningTCPPortsErrors(t *testing.T) {
	root := t.TempDir()
	if _, err := (&FS{Root: root}).ListeningTCPPorts(); err == nil {
		t.Error("no net/tcp: want an error")
	}
	procstest.WriteNet(t, root, map[int]uint64{1234: 1}, nil) // no tcp6: IPv6 disabled
	ports, err := (&FS{Root: root}).ListeningTCPPorts()
	if err != nil || !reflect.DeepEqual(firstInodes(ports), map[int]uint64{1234: 1}) {
		t.Errorf("tcp only: %v, %v", ports, err)
	}
	if err := os.WriteFile(filepath.Join(root, "net", "tcp6"), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (&FS{Root: root}).ListeningTCPPorts(); err == nil || !strings.Contains(err.Error(), "tcp6") {
		t.Errorf("garbage tcp6: err = %v", err)
	}
}

func TestUserNames(t *testing.T) {
	calls := map[uint32]int{}
	fs := &FS{lookupUser: func(uid uint32) (string, error) {
		calls[uid]++
		return testUsers(uid)
	}}
	procs := []Proc{{UID: 1000, Detailed: true}, {UID: 1000, Detailed: true}, {UID: 4242, Detailed: true}, {UID: 0, Detailed: true}, {UID: 1001}}
	fs.resolveUsers(procs)
	fs.resolveUsers(procs)
	var got []string
	for _, p := range procs {
		got = append(got, p.User)
	}
	if !reflect.DeepEqual(got, []string{"alice", "alice", "4242", "root", ""}) {
		t.Errorf("users = %q", got)
	}
	if calls[1000] != 1 || calls[4242] != 1 {
		t.Errorf("lookups not cached: %v", calls)
	}
	// The real os/user: root exists everywhere; 4294967290 nowhere.
	real := &FS{}
	if got := real.userName(0); got != "root" {
		t.Errorf("userName(0) = %q", got)
	}
	if got := real.userName(4294967290); got != "4294967290" {
		t.Errorf("userName(unknown) = %q", got)
	}
}

func TestNewTableDuplicates(t *testing.T) {
	table := NewTable([]Proc{{PID: 5, Comm: "first"}, {PID: 3}, {PID: 5, Comm: "second"}})
	if table.Len() != 2 {
		t.Fatalf("Len = %d", table.Len())
	}
	if p, _ := table.Get(5); p.Comm != "first" {
		t.Errorf("duplicate kept %q", p.Comm)
	}
}

func TestFixtureMatchesGenerator(t *testing.T) {
	// The committed tree must be what kernelsFixture generates.
	root := kernelsRoot(t)
	fresh := t.TempDir()
	procstest.WriteTree(t, fresh, kernelsFixture)
	for _, p := range kernelsFixture {
		for _, name := range []string{"stat", "status", "cmdline", "environ"} {
			rel := filepath.Join(strconv.Itoa(p.PID), name)
			a, errA := os.ReadFile(filepath.Join(root, rel))
			b, errB := os.ReadFile(filepath.Join(fresh, rel))
			if errA != nil || errB != nil || string(a) != string(b) {
				t.Errorf("%s differs from the generator (run with -update): %v %v", rel, errA, errB)
			}
		}
	}
}

func TestScanTree(t *testing.T) {
	root := kernelsRoot(t)
	fs := &FS{Root: root, lookupUser: testUsers}
	table, err := fs.ScanTree([]int{1000, 4000, 424242})
	if err != nil {
		t.Fatal(err)
	}
	if table.Len() != len(kernelsFixture) {
		t.Fatalf("Len = %d, want %d", table.Len(), len(kernelsFixture))
	}
	for _, p := range table.All() {
		wantDetailed := p.PID == 1000 || p.PID == 4000
		if p.Detailed != wantDetailed {
			t.Errorf("pid %d: Detailed = %v, want %v", p.PID, p.Detailed, wantDetailed)
		}
		if !p.Detailed && (p.Argv != nil || p.User != "" || p.SessionName != "") {
			t.Errorf("pid %d: details without Detailed: %+v", p.PID, p)
		}
	}
	full := scanFixture(t, root)
	for _, pid := range []int{1000, 4000} {
		a, _ := table.Get(pid)
		b, _ := full.Get(pid)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("pid %d: ScanTree %+v, Scan %+v", pid, a, b)
		}
	}
	if p, _ := table.Get(1005); p.Comm != "cc1 (x) )" || p.PPID != 1004 || p.PGID != 1004 || p.SID != 1000 || p.StartTime != 2104 {
		t.Errorf("stat fields: %+v", p)
	}
}

// A pid that is not a pid of this /proc is looked up as an inner pid
// through NSpid; the process found is read in full.
func TestScanTreeNamespaceFallback(t *testing.T) {
	fs := &FS{Root: kernelsRoot(t), lookupUser: testUsers}
	table, err := fs.ScanTree([]int{7})
	if err != nil {
		t.Fatal(err)
	}
	p, ok := table.Resolve(7)
	if !ok || p.PID != 5001 || !p.Detailed || !reflect.DeepEqual(p.NSpid, []int{5001, 7}) || p.User != "alice" {
		t.Fatalf("Resolve(7) = %+v, %v", p, ok)
	}
	if host, ok := table.LocalToHost(1); !ok || host != 5000 {
		t.Errorf("LocalToHost(1) = %d, %v: NSpid of every process should have been read", host, ok)
	}
	if p, _ := table.Get(5000); p.Detailed {
		t.Errorf("pid 5000 was not asked for, but is Detailed")
	}
}

// The pid is reused between the stat pass and the detail pass: the details
// belong to another process and must not be mixed in.
func TestScanTreePidReusedBetweenPasses(t *testing.T) {
	root := t.TempDir()
	procstest.WriteTree(t, root, []procstest.Proc{
		{PID: 1, PGID: 1, SID: 1, Start: 1, Comm: "init", Argv: []string{"init"}},
		{PID: 40, PPID: 1, PGID: 40, SID: 40, Start: 400, Comm: "old", Argv: []string{"old"}},
	})
	calls := 0
	fs := &FS{Root: root, lookupUser: testUsers}
	fs.beforeRead = func(pid int) {
		if pid != 40 {
			return
		}
		if calls++; calls == 2 { // the detail pass: pid 40 is now a new process
			reused := procstest.Proc{PID: 40, PPID: 1, PGID: 40, SID: 40, Start: 900, Comm: "new"}
			if err := os.WriteFile(filepath.Join(root, "40", "stat"), []byte(reused.StatLine()), 0o644); err != nil {
				t.Error(err)
			}
			if err := os.WriteFile(filepath.Join(root, "40", "cmdline"), []byte("new\x00"), 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	table, err := fs.ScanTree([]int{40})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := table.Get(40)
	if p.Detailed || p.StartTime != 400 || p.Comm != "old" || p.Argv != nil {
		t.Errorf("pid 40 = %+v: details of the new process mixed into the old", p)
	}
}

// firstInodes is port → the inode of its first listener.
func firstInodes(ports map[int][]Listener) map[int]uint64 {
	out := map[int]uint64{}
	for port, ls := range ports {
		out[port] = ls[0].Inode
	}
	return out
}
