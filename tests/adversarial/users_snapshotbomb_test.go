package adversarial

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/snapshot/snapshottest"
)

// The memory snapshot a kernel hands the shared daemon is its user's file:
// whatever bob puts in his, the daemon stays within its memory bound,
// keeps sampling, reduces and keeps alice's snapshot, and ends on SIGTERM.

// snapshotRig is a root shared daemon serving alice's kernel and bob's
// (bobKernels of them), and a watch on the daemon's memory.
type snapshotRig struct {
	alice, bob testenv.User
	ak         *testenv.Kernel
	bks        []*testenv.Kernel
	gpu        *testenv.FakeGPU
	d          *testenv.Daemon
	sock       string
	rss        *rssWatch
}

func startSnapshotRig(t *testing.T, bobKernels int) *snapshotRig {
	t.Helper()
	testenv.Require(t, "ipykernel", "jupyter_client")
	r := &snapshotRig{alice: testenv.MakeUser(t, "sa"), bob: testenv.MakeUser(t, "sb")}
	r.ak = r.alice.StartKernel(t, filepath.Join(r.alice.RuntimeDir(), "kernel-"+testenv.NewKernelID()+".json"))
	for i := 0; i < bobKernels; i++ {
		r.bks = append(r.bks, r.bob.StartKernel(t, filepath.Join(r.bob.RuntimeDir(), "kernel-"+testenv.NewKernelID()+".json")))
	}
	procs := []testenv.FakeProc{{PID: r.ak.Cmd.Process.Pid, UsedBytes: 1 << 30}}
	for _, k := range append([]*testenv.Kernel{r.ak}, r.bks...) {
		testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
		if k != r.ak {
			procs = append(procs, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: 2 << 30})
		}
	}
	r.gpu = testenv.NewFakeGPU(t)
	r.gpu.Set(t, procs...)
	r.d, r.sock = sharedDaemon(t, r.gpu, []testenv.User{r.alice, r.bob})
	for _, k := range append([]*testenv.Kernel{r.ak}, r.bks...) {
		r.d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": k.ID})
	}
	r.rss = watchRSS(t, r.d)
	return r
}

// writeAs writes data to a file of u's in u's home.
func writeAs(t *testing.T, u testenv.User, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(u.Home, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	return path
}

// aliceSnapshot has alice's kernel write a small real snapshot pickle
// (CPython's pickler, torch's layout) and returns its path.
func (r *snapshotRig) aliceSnapshot(t *testing.T) string {
	t.Helper()
	path := filepath.Join(r.alice.Home, "hers.pickle")
	code := fmt.Sprintf(`import pickle
f = {"filename": "/home/alice/train.py", "line": 7, "name": "<module>"}
seg = {"device": 0, "address": 4096, "total_size": 2 << 20, "allocated_size": 1 << 20, "active_size": 1 << 20, "stream": 0,
       "segment_type": "large", "blocks": [{"address": 4096, "size": 1 << 20, "state": "active_allocated", "frames": [f]}]}
tr = [{"action": "alloc", "addr": 4096, "size": 1 << 20, "stream": 0, "time_us": 1, "frames": [f]}]
pickle.dump({"segments": [seg], "device_traces": [tr]}, open(%q, "wb"))`, path)
	if res := testenv.RunCell(t, r.ak.ConnectionFile, code, 60*time.Second); res.Status != "ok" {
		t.Fatalf("alice's snapshot: %+v", res)
	}
	return path
}

// handOver POSTs path as a snapshot from the kernel of connFile and
// returns its id.
func (r *snapshotRig) handOver(t *testing.T, connFile, path string) string {
	t.Helper()
	st, body := kernelPost(t, connFile, "/api/v1/snapshots", fmt.Sprintf(`{"path":%q,"reason":"manual"}`, path))
	var info struct{ ID string }
	if st != 202 || json.Unmarshal([]byte(body), &info) != nil || info.ID == "" {
		if r.rss.killedNow() {
			t.Fatalf("hand over %s: the daemon is gone, killed when its RSS reached %.1f MiB (over %d MiB)", path, float64(r.rss.peakNow())/(1<<20), maxDaemonRSS>>20)
		}
		t.Fatalf("hand over %s: %d %.300s", path, st, body)
	}
	return info.ID
}

type snapshotInfo struct {
	ID, Status, Error string
}

// snapshots lists the snapshots of kernel k as u sees them.
func (r *snapshotRig) snapshots(t *testing.T, u testenv.User, k *testenv.Kernel) []snapshotInfo {
	t.Helper()
	st, body := apiAs(t, u, r.sock, "GET", "/api/v1/kernels/"+k.ID+"/snapshots", "")
	var out struct{ Snapshots []snapshotInfo }
	if st != 200 || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("%s's snapshots of %s: %d %.300s", u.Name, k.ID, st, body)
	}
	return out.Snapshots
}

// waitStatus polls until snapshot id of k leaves "reducing" (deadline
// timeout) and returns it.
func (r *snapshotRig) waitStatus(t *testing.T, u testenv.User, k *testenv.Kernel, id string, timeout time.Duration) snapshotInfo {
	t.Helper()
	var got snapshotInfo
	testenv.Poll(t, timeout, fmt.Sprintf("%s's snapshot %s to be reduced", u.Name, id), func() bool {
		if r.rss.killedNow() {
			t.Fatalf("the daemon was killed: its RSS passed %d MiB", maxDaemonRSS>>20)
		}
		for _, s := range r.snapshots(t, u, k) {
			if s.ID == id {
				got = s
				return s.Status != "reducing"
			}
		}
		t.Fatalf("%s's snapshot %s is no longer listed", u.Name, id)
		return false
	})
	return got
}

// checkPace moves alice's kernel's GPU memory and waits (3 s: the daemon
// samples every 200 ms) for the daemon's report to show it.
func (r *snapshotRig) checkPace(t *testing.T, used uint64) {
	t.Helper()
	procs := []testenv.FakeProc{{PID: r.ak.Cmd.Process.Pid, UsedBytes: used}}
	for _, k := range r.bks {
		procs = append(procs, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: 2 << 30})
	}
	r.gpu.Set(t, procs...)
	start := time.Now()
	ok := testenv.Eventually(3*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rep, err := r.d.Client.Notebooks(ctx)
		if err != nil {
			return false
		}
		for _, nb := range rep.Notebooks {
			if nb.ConnectionFile == r.ak.ConnectionFile && nb.GPUMemoryBytes == used {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Errorf("the daemon's report did not show alice's kernel at %d bytes within 3 s (it samples every 200 ms)", used)
	} else {
		t.Logf("a change of GPU memory reached the report in %v", time.Since(start).Round(time.Millisecond))
	}
}

// TestSnapshotMemoryBombFromAnotherUser: bob hands over a 9-byte pickle
// that stores a value at memo slot 33,554,416 and one of 24 million DUPs;
// the daemon fails both, saying which bound, within 256 MiB, keeps its
// sample pace, and reduces alice's snapshot.
func TestSnapshotMemoryBombFromAnotherUser(t *testing.T) {
	t.Parallel()
	r := startSnapshotRig(t, 1)
	bk := r.bks[0]
	memo := r.handOver(t, bk.ConnectionFile, writeAs(t, r.bob, "memo.pickle", snapshottest.MemoIndexBomb()))
	dup := r.handOver(t, bk.ConnectionFile, writeAs(t, r.bob, "dup.pickle", snapshottest.DupBomb(24<<20)))
	hers := r.handOver(t, r.ak.ConnectionFile, r.aliceSnapshot(t))
	r.checkPace(t, 3<<30)
	for id, want := range map[string]string{memo: "memo slot 33554416 stored when only 0 were", dup: "values on the stack"} {
		if got := r.waitStatus(t, r.bob, bk, id, 60*time.Second); got.Status != "failed" || !strings.Contains(got.Error, want) {
			t.Errorf("bob's snapshot %s: %s %q, want failed with %q", id, got.Status, got.Error, want)
		}
	}
	if got := r.waitStatus(t, r.alice, r.ak, hers, 60*time.Second); got.Status != "ready" {
		t.Errorf("alice's snapshot: %+v, want ready", got)
	}
	r.checkPace(t, 4<<30)
	r.rss.check(t, r.d, "bob's memory bombs")
	if n := len(r.d.Logs("memory snapshot not reduced", map[string]any{"snapshot": memo})); n != 1 {
		t.Errorf("the memo bomb logged %d lines, want 1", n)
	}
}

// TestSnapshotCPUBombFromAnotherUser: bob hands over 2.3 MB that append
// one trace entry of 100,000 keys a million times through the memo, and
// 260 KB that list one segment of 20,000 keys 100,000 times (an old
// reader compared every key at every reference: hours of one core);
// both fail within seconds, alice's snapshot, handed over next, is
// reduced meanwhile, and the daemon keeps its pace.
func TestSnapshotCPUBombFromAnotherUser(t *testing.T) {
	t.Parallel()
	r := startSnapshotRig(t, 1)
	bk := r.bks[0]
	bomb := r.handOver(t, bk.ConnectionFile, writeAs(t, r.bob, "cpu.pickle", snapshottest.CPUBomb(100000, 1000000, 0)))
	segs := r.handOver(t, bk.ConnectionFile, writeAs(t, r.bob, "segs.pickle", snapshottest.SegmentBomb(20000, 100000)))
	hers := r.handOver(t, r.ak.ConnectionFile, r.aliceSnapshot(t))
	start := time.Now()
	got := r.waitStatus(t, r.alice, r.ak, hers, 30*time.Second)
	t.Logf("alice's snapshot reduced %v after it was handed over, beside bob's bomb", time.Since(start).Round(time.Millisecond))
	if got.Status != "ready" {
		t.Errorf("alice's snapshot: %+v, want ready", got)
	}
	r.checkPace(t, 3<<30)
	if got := r.waitStatus(t, r.bob, bk, bomb, 30*time.Second); got.Status != "failed" || !strings.Contains(got.Error, "already consumed") {
		t.Errorf("bob's CPU bomb: %+v, want failed: a dict met again", got)
	}
	if got := r.waitStatus(t, r.bob, bk, segs, 30*time.Second); got.Status != "failed" || !strings.Contains(got.Error, "CPU bound") {
		t.Errorf("bob's segment bomb: %+v, want failed: past the CPU bound", got)
	}
	r.rss.check(t, r.d, "bob's CPU bomb")
}

// TestSnapshotsOfAnotherUserEvictNone: bob hands over 9 snapshots from
// his two kernels; alice's, handed over first, stays listed and ready
// (each user's last 8 are kept), and bob's first is the one dropped.
func TestSnapshotsOfAnotherUserEvictNone(t *testing.T) {
	t.Parallel()
	r := startSnapshotRig(t, 2)
	hers := r.handOver(t, r.ak.ConnectionFile, r.aliceSnapshot(t))
	if got := r.waitStatus(t, r.alice, r.ak, hers, 60*time.Second); got.Status != "ready" {
		t.Fatalf("alice's snapshot: %+v", got)
	}
	bobs := writeAs(t, r.bob, "his.pickle", []byte("\x80\x04}(\x8c\x08segments]u."))
	var first string
	for i := 0; i < 9; i++ {
		id := r.handOver(t, r.bks[i/6].ConnectionFile, bobs) // 6 a minute per kernel
		if i == 0 {
			first = id
		}
	}
	list := r.snapshots(t, r.alice, r.ak)
	if len(list) != 1 || list[0].ID != hers || list[0].Status != "ready" {
		t.Errorf("alice's snapshots after bob's 9: %+v, want hers (%s), ready", list, hers)
	}
	n := 0
	for _, k := range r.bks {
		for _, s := range r.snapshots(t, r.bob, k) {
			n++
			if s.ID == first {
				t.Errorf("bob's first snapshot %s is still kept after his 9th", first)
			}
		}
	}
	if n != 8 {
		t.Errorf("bob has %d snapshots kept, want his last 8", n)
	}
}

// TestSIGTERMDuringSnapshotReductions: bob hands over the CPU bomb, then
// a plain snapshot of 4 million entries (112 MB) (seconds to reduce); while the
// daemon reduces, SIGTERM ends it within 5 s.
func TestSIGTERMDuringSnapshotReductions(t *testing.T) {
	t.Parallel()
	r := startSnapshotRig(t, 1)
	bk := r.bks[0]
	r.handOver(t, bk.ConnectionFile, writeAs(t, r.bob, "cpu.pickle", snapshottest.CPUBomb(100000, 1000000, 0)))
	var large bytes.Buffer
	if err := snapshottest.WriteLarge(&large, 4_000_000); err != nil {
		t.Fatal(err)
	}
	big := r.handOver(t, bk.ConnectionFile, writeAs(t, r.bob, "large.pickle", large.Bytes()))
	large.Reset()
	cpu0, err := testenv.ProcCPU(r.d.PID())
	if err != nil {
		t.Fatal(err)
	}
	// A reduction is under way: the daemon computes, and bob's large one
	// is not reduced yet.
	testenv.Poll(t, 60*time.Second, "the daemon busy reducing", func() bool {
		cpu, err := testenv.ProcCPU(r.d.PID())
		return err == nil && cpu-cpu0 >= time.Second
	})
	for _, s := range r.snapshots(t, r.bob, bk) {
		if s.ID == big && s.Status != "reducing" {
			t.Fatalf("bob's large snapshot is %s (%s) before SIGTERM: the test needs it in progress", s.Status, s.Error)
		}
	}
	if err := r.d.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	exited := r.d.Wait(5 * time.Second)
	t.Logf("SIGTERM during a reduction: the daemon exited after %v (exited: %v)", time.Since(start).Round(time.Millisecond), exited)
	if !exited {
		t.Fatalf("the daemon was still running 5 s after SIGTERM, during bob's reductions")
	}
	if _, ok := r.d.FindLog("memory snapshot not reduced", map[string]any{"snapshot": big, "error": "~the daemon stopped"}); !ok {
		t.Errorf("no line says bob's large snapshot %s was stopped by the daemon's end", big)
	}
}
