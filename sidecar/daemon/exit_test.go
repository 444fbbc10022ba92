package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// lossyProcs is a ProcReader whose scans lack some pids (as a scan that
// failed to read them would) and whose Exited answers as told.
type lossyProcs struct {
	real   *procs.FS
	hide   []int
	exited func(pid int, start uint64) (bool, error) // nil: the real one
}

func (l lossyProcs) ScanTree(details []int) (*procs.Table, error) {
	table, err := l.real.ScanTree(details)
	if err != nil {
		return nil, err
	}
	var kept []procs.Proc
	for _, p := range table.All() {
		if !slices.Contains(l.hide, p.PID) {
			kept = append(kept, p)
		}
	}
	return procs.NewTable(kept), nil
}

func (l lossyProcs) Exited(pid int, start uint64) (bool, error) {
	if l.exited != nil {
		return l.exited(pid, start)
	}
	return l.real.Exited(pid, start)
}

// A kernel process missing from a scan is not taken for an exit until
// /proc confirms it, one pid at a time: while the process lives, or while
// it cannot be looked at, its tree is neither retired nor reclaimed.
func TestExitConfirmedBeforeReclaim(t *testing.T) {
	r, k1, _ := twoKernels(t, Config{Reclaim: true})
	real := r.d.deps.Procs.(*procs.FS)
	r.d.deps.Procs = lossyProcs{real: real, hide: []int{100}}
	r.d.sample(r.ctx)
	r.waitLog("kernel process missing from the scan of /proc but alive", `"pid":100`)

	r.d.deps.Procs = lossyProcs{real: real, hide: []int{100}, exited: func(int, uint64) (bool, error) {
		return false, syscall.EMFILE
	}}
	r.d.sample(r.ctx)
	r.waitLog("cannot be looked at", "too many open files", "not taken for an exit")

	if strings.Contains(r.logs.String(), "kernel process exited") {
		t.Fatalf("a kernel whose exit was not confirmed was retired:\n%s", r.logs.String())
	}
	if got := r.kills(); len(got) != 0 {
		t.Fatalf("ended %v while the kernel process lives", got)
	}
	if ks := r.kernel(k1); ks == nil || ks.cur.PID != 100 || len(ks.recorded) == 0 {
		t.Fatalf("the kernel lost its process or its recorded tree: %+v", ks)
	}

	// Once /proc says it is gone, it is an exit: its orphans go.
	r.d.deps.Procs = real
	r.exit(100)
	r.d.sample(r.ctx)
	r.waitLog("kernel process exited", `"pid":100`)
	r.waitLog("orphan ended", `"pid":101`)
}

// A kernel process that exited but that its parent has not reaped (a
// zombie: a script's KernelManager that does not poll its kernel) is over:
// its orphans holding GPU memory go.
func TestZombieKernelIsAnExit(t *testing.T) {
	r, _, _ := twoKernels(t, Config{Reclaim: true})
	zombie := r.procs[100]
	zombie.State, zombie.Argv = "Z", nil
	r.setProcs(zombie)
	r.d.sample(r.ctx)
	r.waitLog("kernel process exited", `"pid":100`)
	r.waitLog("orphan ended", `"pid":101`)
}

// TestExitReason: a kernel whose process exited was shut down only when its
// connection file is proven absent (or the scan already found it gone); a
// file that cannot be read proves nothing and reads as a restart.
func TestExitReason(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "kernel-present.json")
	if err := os.WriteFile(present, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A path through a file fails with ENOTDIR, as root too: a failed
	// read that is not an absence.
	unreadable := filepath.Join(present, "kernel-x.json")
	for _, tc := range []struct {
		name string
		ks   kernelState
		want string
	}{
		{"file there", kernelState{connFile: present}, "restart"},
		{"file absent", kernelState{connFile: filepath.Join(dir, "kernel-gone.json")}, "shutdown"},
		{"scan found it gone", kernelState{connFile: present, fileGone: true}, "shutdown"},
		{"file unreadable", kernelState{connFile: unreadable}, "restart"},
		{"pod kernel, its file not ours", kernelState{connFile: filepath.Join(dir, "kernel-gone.json"), pod: &discovery.PodKernel{}}, "restart"},
		{"pod kernel the scan found gone", kernelState{connFile: present, pod: &discovery.PodKernel{}, fileGone: true}, "shutdown"},
	} {
		if got := exitReasonLocked(&tc.ks); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
