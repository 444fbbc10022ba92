package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/snapshot"
	"github.com/gpumem/gpumem/sidecar/snapshot/snapshottest"
)

// writeSnapshot writes a minimal memory snapshot pickle with CPython.
func writeSnapshot(t *testing.T, path string) {
	t.Helper()
	code := `import pickle, sys
f = {"filename": "/tmp/ipykernel_1/7.py", "line": 3, "name": "<module>"}
seg = {"device": 0, "address": 4096, "total_size": 2 << 20, "allocated_size": 1 << 20, "active_size": 1 << 20, "stream": 0,
       "segment_type": "large", "blocks": [{"address": 4096, "size": 1 << 20, "state": "active_allocated", "frames": [f]},
                                           {"address": 4096 + (1 << 20), "size": 1 << 20, "state": "inactive", "frames": []}]}
tr = [{"action": "alloc", "addr": 4096, "size": 1 << 20, "stream": 0, "time_us": 1, "frames": [f]}]
pickle.dump({"segments": [seg], "device_traces": [tr]}, open(sys.argv[1], "wb"))`
	if out, err := exec.Command(testenv.Python(), "-c", code, path).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

func TestSnapshotsReduceAndKeep(t *testing.T) {
	r := newRig(t, Config{})
	ctx := context.Background()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "s.pickle")
	writeSnapshot(t, path)
	uid := uint32(os.Geteuid())
	info, err := r.d.api().AddSnapshot(ctx, refOf("k1"), uid, api.SnapshotRequest{Path: path, Reason: "manual"})
	if err != nil || info.ID != "s1" || info.Status != "reducing" {
		t.Fatalf("%+v %v", info, err)
	}
	testenv.Poll(t, 10*time.Second, "the reduction", func() bool {
		got, _, _ := r.d.api().MemorySnapshot(ctx, refOf("k1"), "s1")
		return got.Status != "reducing"
	})
	got, red, err := r.d.api().MemorySnapshot(ctx, refOf("k1"), "s1")
	if err != nil || got.Status != "ready" || !strings.Contains(string(red), `"where":{"filename":"/tmp/ipykernel_1/7.py","line":3`) {
		t.Fatalf("%+v %s %v", got, red, err)
	}
	// Another kernel's, and another file's of the same kernel id.
	twin := api.KernelRef{ID: "k1", ConnectionFile: "/home/other/kernel-k1.json"}
	if _, _, err := r.d.api().MemorySnapshot(ctx, refOf("k2"), "s1"); !errors.Is(err, api.ErrKernelNotFound) {
		t.Errorf("another kernel's snapshot: %v", err)
	}
	if _, _, err := r.d.api().SnapshotFile(ctx, twin, "s1"); !errors.Is(err, api.ErrKernelNotFound) {
		t.Errorf("a snapshot through another file of the same id: %v", err)
	}
	// The file goes; the download still reads what was handed over.
	want, _ := os.ReadFile(path)
	os.Remove(path)
	rd, _, err := r.d.api().SnapshotFile(ctx, refOf("k1"), "s1")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, len(want)+10)
	n, _ := rd.Read(b)
	if string(b[:n]) != string(want) {
		t.Errorf("raw: %d bytes, want %d", n, len(want))
	}
	evs, _ := r.d.hist.events.After(0)
	if len(evs) != 1 || evs[0].Kind != "snapshot" || evs[0].Reason != "s1" {
		t.Errorf("events %+v", evs)
	}
	// Not a snapshot: failed, with the reason.
	bad := filepath.Join(dir, "bad.pickle")
	if err := os.WriteFile(bad, []byte("\x80\x04K\x01."), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.d.api().AddSnapshot(ctx, refOf("k1"), uid, api.SnapshotRequest{Path: bad, Reason: "manual"}); err != nil {
		t.Fatal(err)
	}
	testenv.Poll(t, 10*time.Second, "the failed reduction", func() bool {
		got, _, _ := r.d.api().MemorySnapshot(ctx, refOf("k1"), "s2")
		return got.Status == "failed" && strings.Contains(got.Error, "not a PyTorch memory snapshot")
	})
	// At most snapshotBurst a minute per kernel.
	writeSnapshot(t, path)
	var last error
	for i := 0; i < snapshotBurst; i++ {
		_, last = r.d.api().AddSnapshot(ctx, refOf("k1"), uid, api.SnapshotRequest{Path: path, Reason: "manual"})
	}
	if !errors.Is(last, api.ErrTooMany) {
		t.Errorf("a flood of snapshots: %v", last)
	}
	// A user's store keeps their last maxSnapshotsPerUser.
	for i := 0; i < maxSnapshotsPerUser; i++ {
		if _, err := r.d.api().AddSnapshot(ctx, refOf("k"+string(rune('a'+i))), uid, api.SnapshotRequest{Path: path, Reason: "manual"}); err != nil {
			t.Fatal(err)
		}
	}
	if list, _ := r.d.api().Snapshots(ctx, refOf("k1")); len(list) != 0 {
		t.Errorf("k1's snapshots after %d others of its user's: %+v", maxSnapshotsPerUser, list)
	}
	r.d.wg.Wait()
	r.d.closeSnapshots()
}

func TestSnapshotOfAnotherUsersFile(t *testing.T) {
	testenv.RequireRoot(t, "a file of another uid")
	r := newRig(t, Config{})
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	path := filepath.Join(dir, "s.pickle")
	writeSnapshot(t, path)
	// The caller is uid 4242; the file is root's.
	_, err := r.d.api().AddSnapshot(context.Background(), refOf("k1"), 4242, api.SnapshotRequest{Path: path, Reason: "manual"})
	if err == nil || strings.Contains(err.Error(), "uid 0") || !strings.Contains(err.Error(), "is not a regular file of yours") {
		t.Errorf("another user's file: %v", err)
	}
	missing := filepath.Join(dir, "nope.pickle")
	_, err2 := r.d.api().AddSnapshot(context.Background(), refOf("k1"), 4242, api.SnapshotRequest{Path: missing, Reason: "manual"})
	if err2 == nil || strings.Replace(err2.Error(), missing, path, 1) != err.Error() {
		t.Errorf("a missing file and another user's differ: %v / %v", err2, err)
	}
}

// ownedSnapshot writes a minimal snapshot owned by uid in dir.
func ownedSnapshot(t *testing.T, dir string, uid int, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	writeSnapshot(t, path)
	if err := os.Chown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSnapshotsKeptPerUser: one user's handovers evict only their own
// oldest snapshot, never another user's.
func TestSnapshotsKeptPerUser(t *testing.T) {
	testenv.RequireRoot(t, "files of two uids")
	r := newRig(t, Config{})
	ctx := context.Background()
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	const alice, bob = 4242, 4343
	hers, err := r.d.api().AddSnapshot(ctx, refOf("ka"), alice, api.SnapshotRequest{Path: ownedSnapshot(t, dir, alice, "a.pickle"), Reason: "manual"})
	if err != nil {
		t.Fatal(err)
	}
	bobs := ownedSnapshot(t, dir, bob, "b.pickle")
	var first api.SnapshotInfo
	for i := 0; i < 3*maxSnapshotsPerUser; i++ {
		info, err := r.d.api().AddSnapshot(ctx, refOf(fmt.Sprintf("kb%d", i)), bob, api.SnapshotRequest{Path: bobs, Reason: "manual"})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = info
		}
	}
	if list, _ := r.d.api().Snapshots(ctx, refOf("ka")); len(list) != 1 || list[0].ID != hers.ID {
		t.Errorf("alice's snapshots after bob's %d: %+v, want hers", 3*maxSnapshotsPerUser, list)
	}
	if list, _ := r.d.api().Snapshots(ctx, refOf("kb0")); len(list) != 0 {
		t.Errorf("bob's first snapshot %s is still kept: %+v", first.ID, list)
	}
	r.d.snapshots.mu.Lock()
	n := 0
	for _, e := range r.d.snapshots.entries {
		if e.uid == bob {
			n++
		}
	}
	r.d.snapshots.mu.Unlock()
	if n != maxSnapshotsPerUser {
		t.Errorf("bob has %d snapshots kept, want %d", n, maxSnapshotsPerUser)
	}
	r.d.wg.Wait()
	r.d.closeSnapshots()
}

// TestSnapshotReductionsPerUser: a user's reduction that runs on never
// delays another user's; the daemon's end stops it at once.
func TestSnapshotReductionsPerUser(t *testing.T) {
	testenv.RequireRoot(t, "files of two uids")
	r := newRig(t, Config{})
	runCtx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	r.d.runContext = runCtx
	const alice, bob = 4242, 4343
	real := r.d.snapshots.reduce
	started := make(chan struct{})
	r.d.snapshots.reduce = func(ctx context.Context, rd io.Reader) (*snapshot.Reduction, error) {
		b, _ := io.ReadAll(rd)
		if string(b) == "bob's" { // a reduction that goes on until stopped
			close(started)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return real(ctx, bytes.NewReader(b))
	}
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	bobs := filepath.Join(dir, "b.pickle")
	if err := os.WriteFile(bobs, []byte("bob's"), 0o600); err != nil || os.Chown(bobs, bob, bob) != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b, err := r.d.api().AddSnapshot(ctx, refOf("kb"), bob, api.SnapshotRequest{Path: bobs, Reason: "manual"})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	a, err := r.d.api().AddSnapshot(ctx, refOf("ka"), alice, api.SnapshotRequest{Path: ownedSnapshot(t, dir, alice, "a.pickle"), Reason: "manual"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Poll(t, 10*time.Second, "alice's reduction beside bob's", func() bool {
		got, _, _ := r.d.api().MemorySnapshot(ctx, refOf("ka"), a.ID)
		return got.Status == "ready"
	})
	if got, _, _ := r.d.api().MemorySnapshot(ctx, refOf("kb"), b.ID); got.Status != "reducing" {
		t.Errorf("bob's: %+v, want still reducing", got)
	}
	stop()
	done := make(chan struct{})
	go func() { r.d.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("bob's reduction went on 5 s after the daemon's end")
	}
	if got, _, _ := r.d.api().MemorySnapshot(ctx, refOf("kb"), b.ID); got.Status != "failed" || !strings.Contains(got.Error, "the daemon stopped") {
		t.Errorf("bob's after the end: %+v", got)
	}
	r.d.closeSnapshots()
}

// TestSnapshotBounds: each bound a snapshot meets fails it (or refuses
// it) with a sentence that says which and what to do.
func TestSnapshotBounds(t *testing.T) {
	r := newRig(t, Config{})
	ctx := context.Background()
	uid := uint32(os.Geteuid())
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	big := filepath.Join(dir, "big.pickle")
	f, err := os.Create(big)
	if err == nil {
		err = f.Truncate(maxSnapshotBytes + 1)
	}
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := r.d.api().AddSnapshot(ctx, refOf("k1"), uid, api.SnapshotRequest{Path: big, Reason: "manual"}); err == nil ||
		!strings.Contains(err.Error(), "over the 128 MiB gpumem reduces: record fewer entries") {
		t.Errorf("a file over maxSnapshotBytes: %v", err)
	}
	cases := []struct {
		name string
		raw  []byte
		has  string
	}{
		{"the memo bomb", snapshottest.MemoIndexBomb(), "stored when only 0 were"},
		{"the stack bomb", snapshottest.DupBomb(2 << 20), "is past what gpumem reduces: pickle: opcode 0x32 at byte"},
		{"the CPU bomb", snapshottest.CPUBomb(100000, 1000000, 0), "a dict the reader already consumed"},
	}
	for i, c := range cases {
		path := filepath.Join(dir, fmt.Sprintf("bomb%d.pickle", i))
		if err := os.WriteFile(path, c.raw, 0o600); err != nil {
			t.Fatal(err)
		}
		info, err := r.d.api().AddSnapshot(ctx, refOf(fmt.Sprintf("kbomb%d", i)), uid, api.SnapshotRequest{Path: path, Reason: "manual"})
		if err != nil {
			t.Fatal(err)
		}
		testenv.Poll(t, 20*time.Second, c.name, func() bool {
			got, _, _ := r.d.api().MemorySnapshot(ctx, refOf(fmt.Sprintf("kbomb%d", i)), info.ID)
			return got.Status != "reducing"
		})
		got, _, _ := r.d.api().MemorySnapshot(ctx, refOf(fmt.Sprintf("kbomb%d", i)), info.ID)
		if got.Status != "failed" || !strings.Contains(got.Error, c.has) {
			t.Errorf("%s: %s %q, want failed with %q", c.name, got.Status, got.Error, c.has)
		}
	}
	// A reduction too big to keep.
	r.d.snapshots.reduce = func(ctx context.Context, rd io.Reader) (*snapshot.Reduction, error) {
		return &snapshot.Reduction{Stacks: make([]snapshot.Stack, maxReductionBytes/10)}, nil
	}
	info, err := r.d.api().AddSnapshot(ctx, refOf("k1"), uid, api.SnapshotRequest{Path: ownedSnapshot(t, dir, int(uid), "s.pickle"), Reason: "manual"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Poll(t, 20*time.Second, "the big reduction", func() bool {
		got, _, _ := r.d.api().MemorySnapshot(ctx, refOf("k1"), info.ID)
		return got.Status == "failed" && strings.Contains(got.Error, "MiB of JSON, over the 8 MiB the daemon keeps")
	})
	r.d.wg.Wait()
	r.d.closeSnapshots()
}
