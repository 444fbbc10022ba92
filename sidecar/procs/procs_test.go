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
var kernelsFixture = []fproc{
	{pid: 1, ppid: 0, pgid: 1, sid: 1, start: 1, comm: "systemd", argv: []string{"/sbin/init"}},
	{pid: 2, ppid: 0, pgid: 0, sid: 0, start: 1, comm: "kthreadd"},
	{pid: 3, ppid: 2, pgid: 0, sid: 0, start: 2, comm: "kworker/0:0-events"},
	{pid: 500, ppid: 1, pgid: 500, sid: 500, uid: 1000, start: 100, comm: "jupyter-noteboo",
		argv: []string{"/usr/bin/python3", "/usr/bin/jupyter-notebook", "--no-browser"}},
	{pid: 1000, ppid: 500, pgid: 1000, sid: 1000, uid: 1000, start: 2000, comm: "python3",
		argv:    []string{"/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "/run/user/1000/jupyter/kernel-aaaa.json"},
		env:     []string{"JPY_PARENT_PID=500", "JPY_SESSION_NAME=/home/alice/train (1).ipynb"},
		sockets: []uint64{31001, 31002}},
	{pid: 1001, ppid: 1000, pgid: 1000, sid: 1000, uid: 1000, start: 2100, comm: "pt_data_worker", argv: []string{"/usr/bin/python3", "-c", "worker"},
		env: []string{"JPY_SESSION_NAME=/home/alice/train (1).ipynb"}, sockets: []uint64{31001}},
	{pid: 1002, ppid: 1001, pgid: 1000, sid: 1000, uid: 1000, start: 2101, comm: "sh", argv: []string{"sh", "-c", "deep"}},
	{pid: 1003, ppid: 1002, pgid: 1003, sid: 1000, uid: 1000, start: 2102, comm: "bash", argv: []string{"bash"}},
	{pid: 1004, ppid: 1003, pgid: 1004, sid: 1000, uid: 1000, start: 2103, comm: "make", argv: []string{"make", "-j"}},
	{pid: 1005, ppid: 1004, pgid: 1004, sid: 1000, uid: 1000, start: 2104, comm: "cc1 (x) )", argv: []string{"cc1", "weird comm"}},
	{pid: 1006, ppid: 1005, pgid: 1004, sid: 1000, uid: 1000, start: 2105, comm: "as", argv: []string{"as"}},
	{pid: 1010, ppid: 1000, pgid: 1010, sid: 1010, uid: 1000, start: 2200, comm: "ray", argv: []string{"ray::worker"}},
	{pid: 2001, ppid: 1, pgid: 2000, sid: 2000, uid: 1000, start: 3100, comm: "python3", argv: []string{"python3", "pool.py"}},
	{pid: 2002, ppid: 2001, pgid: 2002, sid: 2002, uid: 1000, start: 3101, comm: "python3", argv: []string{"python3", "grandchild"}},
	{pid: 600, ppid: 1, pgid: 600, sid: 600, uid: 1000, start: 150, comm: "systemd", argv: []string{"/lib/systemd/systemd", "--user"}},
	{pid: 2003, ppid: 600, pgid: 2000, sid: 2000, uid: 1000, start: 3102, comm: "python3", argv: []string{"python3", "-c", "cuda"}},
	{pid: 1500, ppid: 1, pgid: 2000, sid: 2000, uid: 1000, start: 10, comm: "stale", argv: []string{"stale"}},
	{pid: 3000, ppid: 500, pgid: 500, sid: 500, uid: 1000, start: 9000, comm: "sleep", argv: []string{"sleep", "100"}},
	{pid: 3001, ppid: 3000, pgid: 500, sid: 500, uid: 1000, start: 9001, comm: "sleep", argv: []string{"sleep", "1"}},
	{pid: 4000, ppid: 1, pgid: 4000, sid: 4000, uid: 1001, start: 4000, comm: "python3", argv: []string{"python3", "train.py", "--epochs", "10"}},
	{pid: 5000, ppid: 1, pgid: 5000, sid: 5000, uid: 0, start: 5000, comm: "tini", argv: []string{"tini", "--"}, nspid: []int{5000, 1}},
	{pid: 5001, ppid: 5000, pgid: 5001, sid: 5001, uid: 1000, start: 5001, comm: "python3",
		argv: []string{"python3", "-m", "ipykernel_launcher"}, nspid: []int{5001, 7}},
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
		writeFixture(t, root, kernelsFixture)
		writeNet(t, root, kernelsListening, map[int]uint64{52003: 31003})
	}
	if _, err := os.Stat(root); err != nil {
		t.Fatalf("%v: run go test ./sidecar/procs -run %s -update", err, t.Name())
	}
	return root
}

func writeNet(t testing.TB, root string, v4, v6 map[int]uint64) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "net", "tcp"), []byte(netTCP(false, v4)), 0o644); err != nil {
		t.Fatal(err)
	}
	if v6 != nil {
		if err := os.WriteFile(filepath.Join(root, "net", "tcp6"), []byte(netTCP(true, v6)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
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
	want := Proc{PID: 1000, PPID: 500, PGID: 1000, SID: 1000, UID: 1000, User: "alice", StartTime: 2000, Comm: "python3",
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
		t.Errorf("All() not sorted by pid: %v", pids)
	}
	if got := pidsOf(table.Children(1000)); !reflect.DeepEqual(got, []int{1001, 1010}) {
		t.Errorf("Children(1000) = %v", got)
	}
}

func TestKernelProcesses(t *testing.T) {
	table := scanFixture(t, kernelsRoot(t))
	tests := []struct {
		name  string
		pid   int
		start uint64
		want  []int
	}{
		{"live kernel: deep tree and setsid child", 1000, 2000, []int{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1010}},
		{"start unknown", 1000, 0, []int{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1010}},
		{"wrong start: a reused pid is not the kernel", 1000, 1999, nil},
		{"killed kernel: orphans reparented to init and to a subreaper, with their children", 2000, 3000, []int{2001, 2002, 2003}},
		{"killed kernel, start unknown: older session members too", 2000, 0, []int{1500, 2001, 2002, 2003}},
		{"pid reused by an unrelated process", 3000, 5000, nil},
		{"no such process", 7777, 7000, nil},
		{"invalid pid", 0, 0, nil},
		{"process group of a non-leader", 1004, 2103, []int{1004, 1005, 1006}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pidsOf(table.KernelProcesses(tt.pid, tt.start))
			if len(got) == 0 && len(tt.want) == 0 {
				return
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("KernelProcesses(%d, %d) = %v, want %v", tt.pid, tt.start, got, tt.want)
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
	// Two containers with the same inner pid: ambiguous, so not mapped.
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
	if !reflect.DeepEqual(ports, want) {
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
	writeNet(t, root, map[int]uint64{1234: 1}, nil) // no tcp6: IPv6 disabled
	ports, err := (&FS{Root: root}).ListeningTCPPorts()
	if err != nil || !reflect.DeepEqual(ports, map[int]uint64{1234: 1}) {
		t.Errorf("tcp only: %v, %v", ports, err)
	}
	if err := os.WriteFile(filepath.Join(root, "net", "tcp6"), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (&FS{Root: root}).ListeningTCPPorts(); err == nil || !strings.Contains(err.Error(), "tcp6") {
		t.Errorf("garbage tcp6: err = %v", err)
	}
}

// Entries that cannot be read, or vanish while the scan runs, are skipped
// (or lose only the unreadable part); the scan itself does not fail.
func TestScanToleratesBrokenEntries(t *testing.T) {
	root := t.TempDir()
	writeFixture(t, root, []fproc{
		{pid: 1, ppid: 0, pgid: 1, sid: 1, start: 1, comm: "init", argv: []string{"init"}},
		{pid: 10, ppid: 1, pgid: 10, sid: 10, uid: 1000, start: 50, comm: "ok", argv: []string{"ok"}, env: []string{"JPY_SESSION_NAME=a.ipynb"}},
		{pid: 11, ppid: 1, pgid: 11, sid: 11, start: 51, comm: "nostat", omit: []string{"stat"}},
		{pid: 12, ppid: 1, pgid: 12, sid: 12, start: 52, comm: "statdir", asDir: []string{"stat"}},
		{pid: 13, ppid: 1, pgid: 13, sid: 13, uid: 1000, start: 53, comm: "noenv", argv: []string{"x"}, asDir: []string{"environ"}},
		{pid: 14, ppid: 1, pgid: 14, sid: 14, uid: 1000, start: 54, comm: "nostatus", argv: []string{"y"}, asDir: []string{"status"}},
		{pid: 15, ppid: 1, pgid: 15, sid: 15, start: 55, comm: "gone-after-stat", omit: []string{"cmdline"}},
		{pid: 16, ppid: 1, pgid: 16, sid: 16, start: 56, comm: "vanishes"},
		{pid: 17, ppid: 1, pgid: 17, sid: 17, start: 57, comm: "half-vanishes"},
	})
	for name, content := range map[string]string{
		"18/stat":  "18 (garbage",                                // truncated stat
		"19/stat":  fproc{pid: 20, ppid: 1, start: 5}.statLine(), // another pid's stat
		"21":       "a file, not a directory",
		"self":     "not a pid",
		"0badname": "not a pid",
	} {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs := &FS{Root: root, lookupUser: testUsers}
	fs.beforeRead = func(pid int) {
		switch pid {
		case 16: // the whole process goes between listing and reading
			_ = os.RemoveAll(filepath.Join(root, "16"))
		case 17: // exits after its stat was written but before cmdline is read
			_ = os.Remove(filepath.Join(root, "17", "status"))
		}
	}
	table, err := fs.Scan()
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	if got := pidsOf(table.All()); !reflect.DeepEqual(got, []int{1, 10, 13, 14}) {
		t.Errorf("pids = %v, want [1 10 13 14]", got)
	}
	if p, _ := table.Get(10); p.SessionName != "a.ipynb" || p.User != "alice" {
		t.Errorf("pid 10: %+v", p)
	}
	if p, _ := table.Get(13); p.SessionName != "" || !reflect.DeepEqual(p.Argv, []string{"x"}) {
		t.Errorf("unreadable environ: %+v", p)
	}
	// Unreadable status: the uid comes from the directory's owner.
	if p, _ := table.Get(14); p.UID != uint32(os.Getuid()) || p.NSpid != nil || !reflect.DeepEqual(p.Argv, []string{"y"}) {
		t.Errorf("unreadable status: %+v", p)
	}

	if _, err := (&FS{Root: filepath.Join(root, "missing")}).Scan(); err == nil {
		t.Error("Scan of a missing root: want an error")
	}
}

func TestUserNames(t *testing.T) {
	calls := map[uint32]int{}
	fs := &FS{lookupUser: func(uid uint32) (string, error) {
		calls[uid]++
		return testUsers(uid)
	}}
	procs := []Proc{{UID: 1000}, {UID: 1000}, {UID: 4242}, {UID: 0}}
	fs.resolveUsers(procs)
	fs.resolveUsers(procs)
	var got []string
	for _, p := range procs {
		got = append(got, p.User)
	}
	if !reflect.DeepEqual(got, []string{"alice", "alice", "4242", "root"}) {
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
	writeFixture(t, fresh, kernelsFixture)
	for _, p := range kernelsFixture {
		for _, name := range []string{"stat", "status", "cmdline", "environ"} {
			rel := filepath.Join(strconv.Itoa(p.pid), name)
			a, errA := os.ReadFile(filepath.Join(root, rel))
			b, errB := os.ReadFile(filepath.Join(fresh, rel))
			if errA != nil || errB != nil || string(a) != string(b) {
				t.Errorf("%s differs from the generator (run with -update): %v %v", rel, errA, errB)
			}
		}
	}
}
