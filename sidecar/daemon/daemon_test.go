package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// twoKernels writes kernel k1 (pid 100) with children 101 (on the GPU),
// 102 (not on the GPU), 103 (on the GPU, another user's) and 104 (on the
// GPU, in its own session, reparented to init), and kernel k2 (pid 200)
// with child 201 (on the GPU); then scans and samples once.
func twoKernels(t *testing.T, cfg Config) (r *rig, k1, k2 string) {
	return twoKernelsOn(t, newRig(t, cfg))
}

// twoKernelsOn is twoKernels on a rig made already.
func twoKernelsOn(t *testing.T, r *rig) (_ *rig, k1, k2 string) {
	k1, k2 = twoKernelFilesOn(r)
	r.d.scan(r.ctx)
	r.d.sample(r.ctx)
	if got := r.report(); !slices.Equal(got["k1"], []int{100, 101, 103, 104}) || !slices.Equal(got["k2"], []int{200, 201}) {
		t.Fatalf("report pids %v", got)
	}
	return r, k1, k2
}

// twoKernelFiles writes twoKernels' processes and files, and neither scans
// nor samples: for a test that runs the daemon.
func twoKernelFiles(t *testing.T, cfg Config) (r *rig, k1, k2 string) {
	r = newRig(t, cfg)
	k1, k2 = twoKernelFilesOn(r)
	return r, k1, k2
}

// twoKernelFilesOn is twoKernelFiles on a rig made already.
func twoKernelFilesOn(r *rig) (k1, k2 string) {
	r.setProcs(
		procstest.Proc{PID: 100, PPID: 1, PGID: 100, SID: 100, Argv: []string{"python", "-m", "ipykernel_launcher", "-f", "k1.json"}},
		procstest.Proc{PID: 101, PPID: 100, PGID: 100, SID: 100, Argv: []string{"python", "worker.py"}},
		procstest.Proc{PID: 102, PPID: 100, PGID: 100, SID: 100, Argv: []string{"sleep", "600"}},
		procstest.Proc{PID: 103, PPID: 100, PGID: 100, SID: 100, UID: 4242, Argv: []string{"python", "theirs.py"}},
		procstest.Proc{PID: 104, PPID: 100, PGID: 104, SID: 104, Argv: []string{"python", "server.py"}},
		procstest.Proc{PID: 200, PPID: 1, PGID: 200, SID: 200, Argv: []string{"python", "-m", "ipykernel_launcher", "-f", "k2.json"}},
		procstest.Proc{PID: 201, PPID: 200, PGID: 200, SID: 200, Argv: []string{"python", "train.py"}},
	)
	r.setGPU(100, 1<<30, 101, 2<<30, 103, 3<<30, 104, 4<<30, 200, 1<<30, 201, 5<<30)
	k1 = r.kernelFile("k1", discovery.Owner{PID: 100, Start: 100, FromPort: true, UIDMatch: true, Proven: true})
	k2 = r.kernelFile("k2", discovery.Owner{PID: 200, Start: 200, FromPort: true, UIDMatch: true, Proven: true})
	return k1, k2
}

// A kernel process that exits while its file stays is a restart: of its
// old tree, only our user's processes that hold GPU memory are ended; the
// other kernel is untouched; the kernel waits for its next process.
func TestRestartReclaimsOnlyTheOrphansOfTheDeadKernel(t *testing.T) {
	r, k1, _ := twoKernels(t, Config{Reclaim: true})
	r.exit(100)
	r.d.sample(r.ctx)
	r.waitLog("orphan holds GPU memory; left alone", `"pid":103`, "owned by uid 4242")
	r.waitLog("orphan ended", `"pid":104`)
	r.waitLog("orphan ended", `"pid":101`)
	if got := r.kills(); !slices.Equal(sortInts(got), []int{101, 104}) {
		t.Errorf("ended %v, want [101 104]", got)
	}
	ks := r.kernel(k1)
	if ks == nil || !ks.cur.isZero() {
		t.Fatalf("after a restart the kernel should wait for its new process: %+v", ks)
	}
	r.waitLog("kernel process exited", `"after":"restart"`)
	// Its new process is proven and taken.
	r.setProcs(procstest.Proc{PID: 300, PPID: 1, PGID: 300, SID: 300})
	r.mu.Lock()
	r.owners[k1] = discovery.Owner{PID: 300, Start: 300, FromPort: true, UIDMatch: true, Proven: true}
	r.mu.Unlock()
	r.d.scan(r.ctx)
	if ks := r.kernel(k1); ks.cur.PID != 300 {
		t.Errorf("new kernel process %d, want 300", ks.cur.PID)
	}
}

// With --reclaim=false the orphans are only reported.
func TestReclaimReportOnly(t *testing.T) {
	r, _, _ := twoKernels(t, Config{Reclaim: false})
	r.exit(100)
	r.d.sample(r.ctx)
	r.waitLog("would end it (--reclaim=false)", `"pid":101`)
	if got := r.kills(); len(got) != 0 {
		t.Errorf("ended %v with --reclaim=false", got)
	}
}

// A connection file removed while its kernel process lives detaches the
// daemon but ends nothing; once the process exits, its orphans go as after
// a shutdown and the kernel is forgotten.
func TestFileRemovedWhileKernelLives(t *testing.T) {
	r, k1, _ := twoKernels(t, Config{Reclaim: true})
	if err := os.Remove(k1); err != nil {
		t.Fatal(err)
	}
	r.d.scan(r.ctx) // missing: look again after missingGrace
	deadline := time.Now().Add(5 * time.Second)
	for ks := r.kernel(k1); ks == nil || !ks.fileGone; ks = r.kernel(k1) {
		if time.Now().After(deadline) {
			t.Fatalf("the kernel was not marked detached: %+v", ks)
		}
		time.Sleep(missingGrace / 4)
		r.d.scan(r.ctx)
	}
	r.d.sample(r.ctx)
	if got := r.kills(); len(got) != 0 {
		t.Fatalf("ended %v while the kernel process lives", got)
	}
	if got := r.report()["k1"]; !slices.Contains(got, 101) {
		t.Errorf("the live kernel's child left the report: %v", got)
	}
	r.exit(100)
	r.d.sample(r.ctx)
	r.waitLog("kernel process exited", `"after":"shutdown"`)
	r.waitLog("orphan ended", `"pid":101`)
	if ks := r.kernel(k1); ks != nil {
		t.Errorf("a shut-down kernel is still followed: %+v", ks)
	}
	// Written again (same name) for a process of ours that names it (a
	// kernel starting): followed again.
	r.setProcs(procstest.Proc{PID: 300, PPID: 1, PGID: 300, SID: 300})
	r.kernelFile("k1", discovery.Owner{PID: 300, Start: 300, Flagged: true, UIDMatch: true})
	r.d.scan(r.ctx)
	if r.kernel(k1) == nil {
		t.Error("a rewritten connection file is not followed")
	}
}

// A connection file whose port another user's program serves is not
// followed: nothing of the port owner's tree counts, and the reason is
// logged.
func TestUnprovenOwnerNeverCounted(t *testing.T) {
	r := newRig(t, Config{Reclaim: true})
	r.setProcs(procstest.Proc{PID: 500, PPID: 1, PGID: 500, SID: 500, Argv: []string{"nc", "-l"}},
		procstest.Proc{PID: 501, PPID: 500, PGID: 500, SID: 500})
	r.setGPU(501, 1<<30)
	stale := r.kernelFile("stale", discovery.Owner{PID: 500, Start: 500, FromPort: true, Why: "port 1 is served by pid 500 (nc -l), which does not name this connection file"})
	r.d.scan(r.ctx)
	r.d.sample(r.ctx)
	if ks := r.kernel(stale); ks != nil {
		t.Fatalf("a file whose port another program serves is followed: %+v", ks)
	}
	r.waitLog("not counted as a kernel", "which does not name this connection file")
	if got := r.report()["stale"]; len(got) != 0 {
		t.Errorf("report pids %v for an unproven kernel", got)
	}
	r.exit(500)
	r.d.sample(r.ctx)
	if err := os.Remove(stale); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r.d.scan(r.ctx)
		time.Sleep(missingGrace)
	}
	r.d.sample(r.ctx)
	if got := r.kills(); len(got) != 0 {
		t.Errorf("ended %v for a kernel that was never proven", got)
	}
	if r.kernel(stale) != nil {
		t.Error("a removed file with no proven process is still followed")
	}
}

// A connection file met half-written or missing for a moment (ipykernel
// deletes and rewrites it at start-up) is not a removal.
func TestScanToleratesRewrites(t *testing.T) {
	r, k1, _ := twoKernels(t, Config{})
	if err := os.WriteFile(k1, []byte(`{"shell_port":`), 0o600); err != nil {
		t.Fatal(err)
	}
	r.d.scan(r.ctx)
	if err := os.Remove(k1); err != nil {
		t.Fatal(err)
	}
	r.d.scan(r.ctx)
	r.kernelFile("k1", discovery.Owner{PID: 100, Start: 100, FromPort: true, UIDMatch: true, Proven: true})
	r.d.scan(r.ctx)
	if ks := r.kernel(k1); ks == nil || ks.fileGone || ks.cur.PID != 100 {
		t.Fatalf("kernel after a rewrite: %+v", ks)
	}
}

// KernelNow reads now; the report keeps the last sample. KernelOfPID finds
// a process's kernel through its tree.
func TestKernelNowAndKernelOfPID(t *testing.T) {
	r, _, _ := twoKernels(t, Config{})
	r.setGPU(100, 1<<30)
	k1Ref := api.KernelRef{ID: "k1", ConnectionFile: filepath.Join(r.dir, "kernel-k1.json")}
	nb, err := r.d.api().KernelNow(r.ctx, k1Ref)
	if err != nil || nb.GPUMemoryBytes != 1<<30 {
		t.Errorf("KernelNow = %d, %v; want 1 GiB", nb.GPUMemoryBytes, err)
	}
	rep, err := r.d.api().Report(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range rep.Notebooks {
		if n.KernelID == "k1" && n.GPUMemoryBytes != 10<<30 {
			t.Errorf("last sample for k1 = %d, want 10 GiB", n.GPUMemoryBytes)
		}
	}
	if _, err := r.d.api().KernelNow(r.ctx, api.KernelRef{ID: "k1", ConnectionFile: "/elsewhere/kernel-k1.json"}); err == nil || !strings.Contains(err.Error(), "kernel not found") {
		t.Errorf("KernelNow(nope) = %v", err)
	}
	if file, _, ok := r.d.api().KernelOfPID(r.ctx, 201); !ok || file != filepath.Join(r.dir, "kernel-k2.json") {
		t.Errorf("KernelOfPID(201) = %q, %v", file, ok)
	}
	if _, _, ok := r.d.api().KernelOfPID(r.ctx, 1); ok {
		t.Error("init belongs to no kernel")
	}
	ks, err := r.d.api().Kernels(r.ctx)
	if err != nil || len(ks) != 2 || ks[0].PID == 0 {
		t.Errorf("Kernels = %+v, %v", ks, err)
	}
	// Another file of the same id is another kernel.
	if _, err := r.d.api().Free(r.ctx, api.KernelRef{ID: "k1", ConnectionFile: "/elsewhere/kernel-k1.json"}, api.FreeRequest{}); !errors.Is(err, api.ErrKernelNotFound) {
		t.Errorf("Free of an unknown kernel: %v", err)
	}
	if _, err := r.d.api().Free(r.ctx, k1Ref, api.FreeRequest{}); err == nil || !strings.Contains(err.Error(), "not attached") {
		t.Errorf("Free of an unattached kernel: %v", err)
	}
}

// Alerts: over the threshold, the alert file names the biggest holders;
// in shared mode it names users only, and it is the kernels' user's own
// file (0600, in the daemon's dir beside the socket); back under, a
// private daemon's file empties and a user's file goes; a failed write is
// retried.
func TestAlerts(t *testing.T) {
	for _, mode := range []api.Mode{api.ModePrivate, api.ModeShared} {
		t.Run(string(mode), func(t *testing.T) {
			r, _, _ := twoKernels(t, Config{AlertThreshold: 0.1, NotebookAlerts: true, SocketMode: mode})
			path := r.d.kernelAlertFile(uint32(os.Geteuid()))
			if want := r.d.alertFile(); (mode == api.ModeShared) == (path == want) {
				t.Errorf("mode %s: kernels read %s, want the one file %s in private mode only", mode, path, want)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("alert file %s: %v, %v; want 0600", path, fi.Mode(), err)
			}
			var doc struct {
				Alerts []notebookAlert `json:"alerts"`
			}
			mustJSON(t, b, &doc)
			if len(doc.Alerts) != 1 || len(doc.Alerts[0].Kernels) != 2 {
				t.Fatalf("alerts %+v", doc.Alerts)
			}
			msg := doc.Alerts[0].Message
			if mode == api.ModeShared {
				if !strings.Contains(msg, "user ") || strings.Contains(msg, "kernel k") {
					t.Errorf("shared-mode alert names more than users: %s", msg)
				}
				r.setGPU()
				r.d.sample(r.ctx)
				if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the user's alert file once no alert stands: %v, want it gone", err)
				}
				r.waitLog("GPU memory back under the alert threshold")
				return
			}
			if !strings.Contains(msg, "kernel k2") {
				t.Errorf("alert does not name the biggest holder: %s", msg)
			}
			// Back under: the file empties; a failed write is tried again.
			r.setGPU()
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
			r.d.sample(r.ctx)
			r.waitLog("writing the notebook alert file")
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			r.d.sample(r.ctx)
			b, err = os.ReadFile(path)
			if err != nil || strings.TrimSpace(string(b)) != `{"alerts":[]}` {
				t.Errorf("alert file after the failed write: %q, %v", b, err)
			}
			r.waitLog("GPU memory back under the alert threshold")
		})
	}
}

// One runtime dir, one lock: a second holder is refused; a dir deleted and
// made anew is locked anew.
func TestDirLocks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runtime")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	a, b := newDirLocks([]string{dir}), newDirLocks([]string{dir})
	defer a.close()
	defer b.close()
	if watch, errs := a.lock(); len(errs) != 0 || len(watch) != 1 {
		t.Fatalf("first lock: %v, %v", watch, errs)
	}
	if watch, errs := b.lock(); len(errs) != 1 || len(watch) != 0 || !strings.Contains(errs[0].Error(), "another gpumem daemon") {
		t.Fatalf("second lock: %v, %v", watch, errs)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if watch, errs := a.lock(); len(errs) != 0 || len(watch) != 1 {
		t.Fatalf("missing dir: %v, %v (still watched, nothing to lock)", watch, errs)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, errs := b.lock(); len(errs) != 0 {
		t.Fatalf("the new dir should be free for b: %v", errs)
	}
	if _, errs := a.lock(); len(errs) != 1 {
		t.Fatalf("a must not hold the new dir too: %v", errs)
	}
}

// Run serves the API, samples, and after the socket's dir is deleted
// serves it again; it returns when ctx ends, leaving no goroutine behind.
func TestRunServesAgainAfterSocketDirDeleted(t *testing.T) {
	r := newRig(t, Config{Interval: 50 * time.Millisecond, Rescan: 50 * time.Millisecond})
	r.setProcs(procstest.Proc{PID: 100, PPID: 1, PGID: 100, SID: 100})
	r.setGPU(100, 1<<30)
	r.kernelFile("k1", discovery.Owner{PID: 100, Start: 100, FromPort: true, UIDMatch: true, Proven: true})
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan error, 1)
	go func() { done <- r.d.Run(ctx) }()
	c := api.NewClient(r.d.cfg.SocketPath)
	defer c.Close()
	healthy := func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned: %v", err)
		default:
		}
		hctx, hcancel := context.WithTimeout(context.Background(), time.Second)
		defer hcancel()
		return c.Healthz(hctx) == nil
	}
	testenv.Poll(t, 15*time.Second, "the API", healthy)
	testenv.Poll(t, 15*time.Second, "the kernel in the report", func() bool { return len(r.report()["k1"]) == 1 })
	// The daemon may write in the dir while it goes: try until it is gone.
	testenv.Poll(t, 15*time.Second, "the runtime dir deleted", func() bool { return os.RemoveAll(r.dir) == nil })
	testenv.Poll(t, 15*time.Second, "the API after its dir was deleted", healthy)
	r.waitLog("serving it again")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return")
	}
}

// A second Run on the same runtime dir fails at once, naming it.
func TestRunRefusesATakenRuntimeDir(t *testing.T) {
	r := newRig(t, Config{})
	other := newDirLocks([]string{r.dir})
	defer other.close()
	if _, errs := other.lock(); len(errs) != 0 {
		t.Fatal(errs)
	}
	err := r.d.Run(r.ctx)
	if err == nil || !strings.Contains(err.Error(), r.dir) {
		t.Fatalf("Run = %v", err)
	}
}

// The same problem is logged at warn once per problemEvery.
func TestProblemRateLimited(t *testing.T) {
	r := newRig(t, Config{})
	for range 5 {
		r.d.problem(os.ErrPermission)
	}
	if n := strings.Count(r.logs.String(), `"level":"warn"`); n != 1 {
		t.Errorf("%d warn lines, want 1:\n%s", n, r.logs.String())
	}
}

func sortInts(v []int) []int {
	slices.Sort(v)
	return v
}

// ReportJSON is the last report encoded as json.Marshal encodes it, the
// same bytes until the next sample, new ones after it.
func TestReportJSONCachedPerSample(t *testing.T) {
	r, _, _ := twoKernels(t, Config{})
	same := func() []byte {
		t.Helper()
		rep, err := r.d.api().Report(r.ctx)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(rep)
		got, err := r.d.api().ReportJSON(r.ctx)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("ReportJSON = %s, %v\nwant %s", got, err, want)
		}
		return got
	}
	first := same()
	if again := same(); &again[0] != &first[0] {
		t.Error("the report was encoded again without a new sample")
	}
	r.setGPU(100, 3<<30)
	r.d.sample(r.ctx)
	if next := same(); bytes.Equal(next, first) {
		t.Error("a new sample with new figures kept the old encoding")
	}
}
