package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// launchingFinder is the rig's finder that also lists connection files
// that processes were launched with, outside the runtime dirs.
type launchingFinder struct {
	*rig
	mu    *sync.Mutex
	files *[]string
}

func (f launchingFinder) LaunchedConnectionFiles([]string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(*f.files), nil
}

// A kernel whose connection file is outside the runtime dirs (a
// KernelManager's /tmp/tmpXXXX.json) is followed as any other: attributed,
// and its orphans reclaimed when it dies. Once no process names its file it
// is forgotten, though the file stays.
func TestLaunchedKernelFollowed(t *testing.T) {
	r := newRig(t, Config{Reclaim: true})
	tmp := filepath.Join(t.TempDir(), "tmpab12cd34.json")
	conn := `{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`
	if err := os.WriteFile(tmp, []byte(conn), 0o600); err != nil {
		t.Fatal(err)
	}
	files := []string{tmp}
	var mu sync.Mutex
	r.d.deps.Finder = launchingFinder{rig: r, mu: &mu, files: &files}
	r.setProcs(
		procstest.Proc{PID: 700, PPID: 1, PGID: 700, SID: 700, Argv: []string{"python", "-m", "ipykernel_launcher", "-f", tmp}},
		// A worker in a session of its own, as pools start them.
		procstest.Proc{PID: 701, PPID: 700, PGID: 701, SID: 701, Argv: []string{"python", "worker.py"}},
	)
	r.setGPU(700, 1<<30, 701, 2<<30)
	r.mu.Lock()
	r.owners[tmp] = discovery.Owner{PID: 700, Start: 700, FromPort: true, UIDMatch: true, Proven: true}
	r.mu.Unlock()

	r.d.scan(r.ctx)
	ks := r.kernel(tmp)
	if ks == nil || !ks.launched || ks.cur.PID != 700 {
		t.Fatalf("the launched kernel is not followed: %+v", ks)
	}
	r.d.sample(r.ctx)
	if got := r.report()["tmpab12cd34"]; !slices.Equal(got, []int{700, 701}) {
		t.Fatalf("report pids %v, want [700 701]", got)
	}
	// Rescans keep it while its process lives (the daemon does not prove
	// a known kernel again, so discovery does not list it).
	for range 3 {
		r.d.scan(r.ctx)
		time.Sleep(missingGrace)
	}
	if ks := r.kernel(tmp); ks == nil || ks.cur.PID != 700 {
		t.Fatalf("a live launched kernel was dropped by a rescan: %+v", ks)
	}

	// The kernel dies (SIGKILL: its file stays), no process names the file.
	r.exit(700)
	mu.Lock()
	files = nil
	mu.Unlock()
	r.d.sample(r.ctx)
	r.waitLog("kernel process exited", `"pid":700`)
	r.waitLog("orphan ended", `"pid":701`)
	deadline := time.Now().Add(5 * time.Second)
	for r.kernel(tmp) != nil {
		if time.Now().After(deadline) {
			t.Fatal("a launched kernel whose file no process names is still followed")
		}
		r.d.scan(r.ctx)
		time.Sleep(missingGrace / 4)
	}
	r.waitLog("no process names the connection file any more")
}
