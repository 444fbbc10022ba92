package daemon

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
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
	// The store keeps the last maxSnapshots.
	for i := 0; i < maxSnapshots; i++ {
		if _, err := r.d.api().AddSnapshot(ctx, refOf("k"+string(rune('a'+i))), uid, api.SnapshotRequest{Path: path, Reason: "manual"}); err != nil {
			t.Fatal(err)
		}
	}
	if list, _ := r.d.api().Snapshots(ctx, refOf("k1")); len(list) != 0 {
		t.Errorf("k1's snapshots after %d others: %+v", maxSnapshots, list)
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
