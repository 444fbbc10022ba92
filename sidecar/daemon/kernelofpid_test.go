package daemon

import (
	"testing"

	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// KernelOfPID reads the caller's ancestry, not all of /proc, and proves
// what a whole table proves (Table.KernelProcesses's rule): a process is
// a kernel's when it or an ancestor is the kernel, or is in the kernel's
// session or group and started after it; never through a kernel pid
// reused by another process.
func TestKernelOfPIDByLineage(t *testing.T) {
	r, k1, k2 := twoKernels(t, Config{})
	chain := []procstest.Proc{{PID: 500, PPID: 101, PGID: 500, SID: 500}}
	for pid := 501; pid < 501+maxLineage; pid++ { // a chain deeper than is read
		chain = append(chain, procstest.Proc{PID: pid, PPID: pid - 1, PGID: 500, SID: 500})
	}
	r.setProcs(append(chain,
		procstest.Proc{PID: 300, PPID: 1, PGID: 100, SID: 100},             // k1's orphan, reparented to init
		procstest.Proc{PID: 301, PPID: 300, PGID: 301, SID: 301},           // its child, in a session of its own
		procstest.Proc{PID: 400, PPID: 1, PGID: 400, SID: 200, Start: 150}, // in k2's session, but older than k2
		procstest.Proc{PID: 600, PPID: 1, PGID: 600, SID: 600},             // no kernel's
	)...)
	for _, c := range []struct {
		name string
		pid  int
		want string // connection file; "" for none
	}{
		{"a kernel", 100, k1},
		{"its child", 201, k2},
		{"a child in a session of its own", 104, k1},
		{"an orphan in the kernel's session", 300, k1},
		{"the orphan's child", 301, k1},
		{"near the top of a deep chain", 510, k1},
		{"below what is read of a chain", 500 + maxLineage, ""},
		{"older than the kernel whose session it names", 400, ""},
		{"no kernel's", 600, ""},
		{"init", 1, ""},
		{"gone", 99999, ""},
	} {
		file, _, ok := r.d.api().KernelOfPID(r.ctx, c.pid)
		if file != c.want || ok != (c.want != "") {
			t.Errorf("%s: KernelOfPID(%d) = %q, %v; want %q", c.name, c.pid, file, ok, c.want)
		}
	}
	// k2's pid reused by another process: its session is no kernel's.
	r.setProcs(procstest.Proc{PID: 200, PPID: 1, PGID: 200, SID: 200, Start: 9000})
	if file, _, ok := r.d.api().KernelOfPID(r.ctx, 201); ok {
		t.Errorf("a process of a reused kernel pid's session: KernelOfPID = %q", file)
	}
}
