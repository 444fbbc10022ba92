package discovery

import (
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/sidecar/procs"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// TestFindKernelsProof: a process is a file's kernel only when it owns the
// port on the file's address, runs as the file's owner and names the file.
func TestFindKernelsProof(t *testing.T) {
	root := t.TempDir()
	launch := func(file string) []string { return []string{"python3", "-m", "ipykernel_launcher", "-f", file} }
	procstest.WriteTree(t, root, []procstest.Proc{
		{PID: 1, PPID: 0, PGID: 1, SID: 1, Start: 1, Comm: "init"},
		{PID: 1000, PPID: 1, PGID: 1000, SID: 1000, Start: 5, UID: 1000, Argv: launch("/rt/kernel-good.json"), Sockets: []uint64{31001}},
		{PID: 2000, PPID: 1, PGID: 2000, SID: 2000, Start: 6, UID: 1000, Argv: []string{"nc", "-l", "52002"}, Sockets: []uint64{31002}},
		{PID: 3000, PPID: 1, PGID: 3000, SID: 3000, Start: 7, UID: 4242, Argv: launch("/rt/kernel-foreign.json"), Sockets: []uint64{31003}},
		{PID: 4000, PPID: 1, PGID: 4000, SID: 4000, Start: 8, UID: 1000, Argv: launch("/elsewhere/kernel-moved.json"), Sockets: []uint64{31004}},
		{PID: 5000, PPID: 1, PGID: 5000, SID: 5000, Start: 9, UID: 1000, Argv: launch("/rt/kernel-starting.json")},
		// Two users' kernels whose files share a name (a kernel id is public).
		{PID: 6000, PPID: 1, PGID: 6000, SID: 6000, Start: 10, UID: 1000, Argv: launch("/rt/kernel-same.json"), Sockets: []uint64{31006}},
		{PID: 7000, PPID: 1, PGID: 7000, SID: 7000, Start: 11, UID: 1001, Argv: launch("/other/kernel-same.json"), Sockets: []uint64{31007}},
	})
	procstest.WriteNet(t, root, map[int]uint64{52001: 31001, 52002: 31002, 52003: 31003, 52004: 31004, 52006: 31006, 52007: 31007}, nil)
	files := []KernelFile{
		{Name: "kernel-good.json", Path: "/rt/kernel-good.json", IP: "127.0.0.1", ShellPort: 52001, UID: 1000},
		{Name: "kernel-stale.json", Path: "/rt/kernel-stale.json", IP: "127.0.0.1", ShellPort: 52002, UID: 1000},
		{Name: "kernel-foreign.json", Path: "/rt/kernel-foreign.json", IP: "127.0.0.1", ShellPort: 52003, UID: 1000},
		{Name: "kernel-moved.json", Path: "/rt/kernel-moved.json", IP: "127.0.0.1", ShellPort: 52004, UID: 1000},
		{Name: "kernel-otheraddr.json", Path: "/rt/kernel-otheraddr.json", IP: "10.1.2.3", ShellPort: 52001, UID: 1000},
		{Name: "kernel-starting.json", Path: "/rt/kernel-starting.json", IP: "127.0.0.1", ShellPort: 52009, UID: 1000},
		{Name: "kernel-same.json", Path: "/rt/kernel-same.json", IP: "127.0.0.1", ShellPort: 52006, UID: 1000},
		{Name: "kernel-same.json", Path: "/other/kernel-same.json", IP: "127.0.0.1", ShellPort: 52007, UID: 1001},
		// A file of uid 1001 planted with the good kernel's ports: judged on
		// its own, and the good kernel's file still proven.
		{Name: "kernel-planted.json", Path: "/other/kernel-planted.json", IP: "127.0.0.1", ShellPort: 52001, UID: 1001},
	}
	got, err := NewProcFinder(&procs.FS{Root: root}).FindKernels(files)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		file               string
		present            bool
		pid                int
		fromPort, uid, pro bool
		why                string
	}{
		{"/rt/kernel-good.json", true, 1000, true, true, true, ""},
		{"/rt/kernel-stale.json", true, 2000, true, true, false, "does not name this connection file"},
		{"/rt/kernel-foreign.json", true, 3000, true, false, false, "of uid 4242, but the file belongs to uid 1000"},
		// argv names a file of the same name elsewhere: not this file.
		{"/rt/kernel-moved.json", true, 4000, true, true, false, "does not name this connection file"},
		// The port is served on another address than the file's.
		{"/rt/kernel-otheraddr.json", false, 0, false, false, false, ""},
		// Not listening yet: the launch line is a hint, never a proof.
		{"/rt/kernel-starting.json", true, 5000, false, true, false, "no process listens"},
		{"/rt/kernel-same.json", true, 6000, true, true, true, ""},
		{"/other/kernel-same.json", true, 7000, true, true, true, ""},
		{"/other/kernel-planted.json", true, 1000, true, false, false, "of uid 1000, but the file belongs to uid 1001"},
	}
	for _, tc := range tests {
		o, ok := got[tc.file]
		if ok != tc.present {
			t.Errorf("%s: present %v, want %v (%+v)", tc.file, ok, tc.present, o)
			continue
		}
		if !ok {
			continue
		}
		if o.PID != tc.pid || o.FromPort != tc.fromPort || o.UIDMatch != tc.uid || o.Proven != tc.pro || !strings.Contains(o.Why, tc.why) {
			t.Errorf("%s: %+v; want pid %d fromPort %v uid %v proven %v why ~%q", tc.file, o, tc.pid, tc.fromPort, tc.uid, tc.pro, tc.why)
		}
	}
}

func TestListenerFor(t *testing.T) {
	ls := []procs.Listener{{IP: net.IPv4(127, 0, 0, 1), Inode: 1}, {IP: net.IPv6loopback, Inode: 2}}
	wild := []procs.Listener{{IP: net.IPv4zero, Inode: 3}}
	tests := []struct {
		ls   []procs.Listener
		ip   string
		want uint64
		ok   bool
	}{
		{ls, "127.0.0.1", 1, true},
		{ls, "::1", 2, true},
		{ls, "localhost", 1, true},
		{ls, "10.0.0.1", 0, false},
		{ls, "*", 0, false},
		{wild, "10.0.0.1", 3, true}, // a wildcard listener serves every address
		{wild, "", 3, true},
		{ls, "not an ip", 0, false},
	}
	for _, tc := range tests {
		got, ok := listenerFor(tc.ls, tc.ip)
		if got != tc.want || ok != tc.ok {
			t.Errorf("listenerFor(%v, %q) = %d, %v; want %d, %v", tc.ls, tc.ip, got, ok, tc.want, tc.ok)
		}
	}
}

// TestScopedFinder: a scoped finder proves what ProcFinder proves, looking
// at the servers' descendants and its extra pids first; a file whose port
// someone outside the scope listens on is judged on every process, and a
// kernel launched outside the runtime dirs is found only within the scope.
func TestScopedFinder(t *testing.T) {
	root := t.TempDir()
	launch := func(file string) []string { return []string{"python3", "-m", "ipykernel_launcher", "-f", file} }
	env := []string{"JUPYTER_RUNTIME_DIR=/rt"}
	tree := []procstest.Proc{
		{PID: 1, PPID: 0, PGID: 1, SID: 1, Start: 1, Comm: "init"},
		{PID: 100, PPID: 1, PGID: 100, SID: 100, Start: 2, UID: 1000, Argv: []string{"python3", "-m", "jupyter_server"}},
		// The server's kernel, and one started by a launcher under it.
		{PID: 1000, PPID: 100, PGID: 1000, SID: 1000, Start: 5, UID: 1000, Argv: launch("/rt/kernel-child.json"), Sockets: []uint64{31001}},
		{PID: 1100, PPID: 100, PGID: 1100, SID: 1100, Start: 6, UID: 1000, Argv: []string{"conda", "run", "python3"}},
		{PID: 1101, PPID: 1100, PGID: 1100, SID: 1100, Start: 7, UID: 1000, Argv: launch("/rt/kernel-grandchild.json"), Sockets: []uint64{31002}},
		// A runtime dir's kernel no server started: outside the scope.
		{PID: 2000, PPID: 1, PGID: 2000, SID: 2000, Start: 8, UID: 1000, Argv: launch("/rt/kernel-orphan.json"), Sockets: []uint64{31003}},
		// Another user's process on a file's port, outside the scope.
		{PID: 2100, PPID: 1, PGID: 2100, SID: 2100, Start: 9, UID: 4242, Argv: []string{"nc", "-l", "52004"}, Sockets: []uint64{31004}},
		// Kernels launched elsewhere (papermill's temp files): one in the
		// scope's extra pids (a GPU process's lineage), one not.
		{PID: 3000, PPID: 1, PGID: 3000, SID: 3000, Start: 10, UID: 1000, Argv: launch("/tmp/tmpgpu.json"), Env: env, Sockets: []uint64{31005}},
		{PID: 3100, PPID: 1, PGID: 3100, SID: 3100, Start: 11, UID: 1000, Argv: launch("/tmp/tmpidle.json"), Env: env, Sockets: []uint64{31006}},
	}
	procstest.WriteTree(t, root, tree)
	procstest.WriteChildren(t, root, tree)
	procstest.WriteNet(t, root, map[int]uint64{52001: 31001, 52002: 31002, 52003: 31003, 52004: 31004, 52005: 31005, 52006: 31006}, nil)
	files := []KernelFile{
		{Name: "kernel-child.json", Path: "/rt/kernel-child.json", IP: "127.0.0.1", ShellPort: 52001, UID: 1000},
		{Name: "kernel-grandchild.json", Path: "/rt/kernel-grandchild.json", IP: "127.0.0.1", ShellPort: 52002, UID: 1000},
		{Name: "kernel-orphan.json", Path: "/rt/kernel-orphan.json", IP: "127.0.0.1", ShellPort: 52003, UID: 1000},
		{Name: "kernel-taken.json", Path: "/rt/kernel-taken.json", IP: "127.0.0.1", ShellPort: 52004, UID: 1000},
		{Name: "kernel-stale.json", Path: "/rt/kernel-stale.json", IP: "127.0.0.1", ShellPort: 52009, UID: 1000},
	}
	fs := &procs.FS{Root: root}
	want, err := NewProcFinder(fs).FindKernels(files)
	if err != nil {
		t.Fatal(err)
	}
	extraCalls := 0
	scoped := NewScopedProcFinder(fs, func() []int { extraCalls++; return []int{3000, 1} })
	scoped.SetServers([]Server{{PID: 100}})
	got, err := scoped.FindKernels(files)
	if err != nil {
		t.Fatal(err)
	}
	for _, kf := range files {
		g, w := got[kf.Path], want[kf.Path]
		if g != w {
			t.Errorf("%s: scoped %+v, unscoped %+v", kf.Path, g, w)
		}
	}
	for path, pid := range map[string]int{"/rt/kernel-child.json": 1000, "/rt/kernel-grandchild.json": 1101, "/rt/kernel-orphan.json": 2000} {
		if o := got[path]; !o.Proven || o.PID != pid {
			t.Errorf("%s: %+v, want proven pid %d", path, o, pid)
		}
	}
	if o := got["/rt/kernel-taken.json"]; o.Proven || o.PID != 2100 || o.UIDMatch {
		t.Errorf("kernel-taken: %+v, want pid 2100 unproven, another uid", o)
	}
	if extraCalls != 0 {
		t.Errorf("extra asked %d times before launched kernels were looked for, want none: the runtime dirs' kernels need not wait for it", extraCalls)
	}
	launched, err := scoped.LaunchedConnectionFiles([]string{"/rt"})
	if err != nil {
		t.Fatal(err)
	}
	if len(launched) != 1 || launched[0] != "/tmp/tmpgpu.json" {
		t.Errorf("launched within the scope: %q, want [/tmp/tmpgpu.json]", launched)
	}
	gpu := KernelFile{Name: "tmpgpu.json", Path: "/tmp/tmpgpu.json", IP: "127.0.0.1", ShellPort: 52005, UID: 1000}
	if o, err := scoped.FindKernels([]KernelFile{gpu}); err != nil || !o[gpu.Path].Proven || o[gpu.Path].PID != 3000 {
		t.Errorf("launched kernel within the scope: %+v, %v; want proven pid 3000", o, err)
	}
	all, err := NewProcFinder(fs).LaunchedConnectionFiles([]string{"/rt"})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Errorf("launched, unscoped: %q, want both temp files", all)
	}
	if pids := scoped.scopePIDs(); !slices.Equal(pids, []int{1, 100, 1000, 1100, 1101, 3000}) {
		t.Errorf("scope %v, want the server, its descendants and extra's", pids)
	}
	if extraCalls != 1 {
		t.Errorf("extra called %d times, want once", extraCalls)
	}
}
