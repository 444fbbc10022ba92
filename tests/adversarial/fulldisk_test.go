package adversarial

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// On a full disk the alert file cannot be written at any sample: that is
// one problem, warned once (then at debug level until problemEvery), not
// a warning per sample; once there is room again the alert is written.
// The disk is a 64 KiB tmpfs holding the socket dir, filled to the brim.
func TestAlertFileOnFullDiskWarnsOnce(t *testing.T) {
	t.Parallel()
	testenv.RequireRoot(t, "the full disk is a tmpfs this test mounts")
	dir := jupyterDir(t)
	sockDir := filepath.Join(dir, "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", sockDir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		testenv.Missing(t, "mount a tmpfs: "+err.Error())
	}
	t.Cleanup(func() { _ = syscall.Unmount(sockDir, syscall.MNT_DETACH) })
	filler := filepath.Join(sockDir, "filler")
	fillDisk(t, filler)

	gpu := testenv.NewFakeGPU(t)
	overThreshold(t, gpu)
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=50ms", "--socket="+filepath.Join(sockDir, "gpumem.sock"))
	d.WaitLog(t, 15*time.Second, "GPU memory over the alert threshold", nil)
	// Each sample (20 a second) tries the write again: 3 s is 60 tries.
	failed := map[string]any{"level": "warn", "error": "~gpumem-alerts.json"}
	d.WaitLog(t, 15*time.Second, "discovery", failed)
	staysUp(t, d, 3*time.Second)
	if n := len(d.Logs("discovery", failed)); n != 1 {
		t.Errorf("the full disk was warned about %d times in 3 s, want once:\n%v", n, d.Logs("discovery", failed))
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	alerts := filepath.Join(sockDir, "gpumem-alerts.json")
	testenv.Poll(t, 15*time.Second, "the alert file once there is room", func() bool {
		b, err := os.ReadFile(alerts)
		var doc struct {
			Alerts []struct{ ID string } `json:"alerts"`
		}
		return err == nil && json.Unmarshal(b, &doc) == nil && len(doc.Alerts) == 1
	})
}

// fillDisk writes path until its filesystem is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", path, err)
			}
			return
		}
	}
}

// staysUp fails if the daemon exits within d: a bounded watch of
// something that must not happen.
func staysUp(t *testing.T, d *testenv.Daemon, dur time.Duration) {
	t.Helper()
	if d.Wait(dur) {
		t.Fatalf("the daemon exited:\n%s", d.Output())
	}
}
