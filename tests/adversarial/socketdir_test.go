package adversarial

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// overThreshold puts a process of 90% of the simulated GPU's 80 GiB on it.
func overThreshold(t *testing.T, gpu *testenv.FakeGPU) {
	t.Helper()
	_, nums := pyProc(t, "import os, time; print(os.getpid(), flush=True); time.sleep(600)")
	gpu.Set(t, testenv.FakeProc{PID: nums[0], UsedBytes: 72 << 30})
}

// A link planted where the daemon writes its alert file's temporary copy is
// never followed: the file it points to is left as it was.
func TestAlertTempFileLinkNotFollowed(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	sockDir := filepath.Join(dir, "sock")
	if err := os.Mkdir(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	alerts := filepath.Join(sockDir, "gpumem-alerts.json")
	if err := os.Symlink(victim, alerts+".tmp"); err != nil {
		t.Fatal(err)
	}
	gpu := testenv.NewFakeGPU(t)
	overThreshold(t, gpu)
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms", "--socket="+filepath.Join(sockDir, "gpumem.sock"))
	testenv.Poll(t, 15*time.Second, "the alert file", func() bool {
		b, err := os.ReadFile(alerts)
		return err == nil && strings.Contains(string(b), "gpu0-")
	})
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Errorf("the file behind the planted link now holds %q", b)
	}
	if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the file behind the planted link changed mode: %v, %v", fi.Mode(), err)
	}
	_ = d
}

// A socket dir that others may write is refused with a clear error.
func TestSocketDirWritableByOthersRefused(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	sockDir := filepath.Join(dir, "open")
	if err := os.Mkdir(sockDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sockDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	d := testenv.TryStartDaemon(t, gpumemBin, dir, testenv.NewFakeGPU(t), "--socket="+filepath.Join(sockDir, "gpumem.sock"))
	if !d.Wait(30 * time.Second) {
		t.Fatal("the daemon started in a socket dir that others can write")
	}
	if out := d.Output(); !strings.Contains(out, "is writable by others") || !strings.Contains(out, sockDir) {
		t.Errorf("the error does not say the dir is writable by others:\n%s", out)
	}
}

// An alert whose write failed (the file's name was briefly a directory) is
// written once the way is clear, though the figures did not change.
func TestAlertWrittenAfterFailedWrite(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	alerts := filepath.Join(dir, "runtime", "gpumem-alerts.json")
	if err := os.Mkdir(alerts, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(alerts, "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	gpu := testenv.NewFakeGPU(t)
	overThreshold(t, gpu)
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms")
	d.WaitLog(t, 15*time.Second, "GPU memory over the alert threshold", nil)
	if err := os.RemoveAll(alerts); err != nil {
		t.Fatal(err)
	}
	testenv.Poll(t, 15*time.Second, "the alert file after the directory went", func() bool {
		b, err := os.ReadFile(alerts)
		var doc struct {
			Alerts []struct{ ID string } `json:"alerts"`
		}
		return err == nil && json.Unmarshal(b, &doc) == nil && len(doc.Alerts) == 1
	})
}

// One runtime dir, one daemon: a second one with its own socket refuses to
// start, naming the dir.
func TestSecondDaemonOnSameRuntimeDir(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	gpu := testenv.NewFakeGPU(t)
	first := testenv.StartDaemon(t, gpumemBin, dir, gpu)
	other := filepath.Join(dir, "elsewhere")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	second := testenv.TryStartDaemon(t, gpumemBin, dir, gpu, "--socket="+filepath.Join(other, "gpumem.sock"))
	if !second.Wait(30 * time.Second) {
		t.Fatal("a second daemon runs on the same runtime dir")
	}
	if out := second.Output(); !strings.Contains(out, "another gpumem daemon is serving this runtime dir") ||
		!strings.Contains(out, filepath.Join(dir, "runtime")) {
		t.Errorf("the second daemon's error does not name the runtime dir:\n%s", out)
	}
	// It names the daemon that serves it, and how to proceed.
	holder := fmt.Sprintf("pid %d (user ", first.Cmd.Process.Pid)
	if out := second.Output(); !strings.Contains(out, holder) || !strings.Contains(out, fmt.Sprintf("kill %d", first.Cmd.Process.Pid)) {
		t.Errorf("the second daemon's error does not name the first, %q:\n%s", holder, out)
	}
	// The same for the socket: a daemon of another runtime dir given the
	// first's socket names the first (the holder of the socket's lock).
	third := testenv.TryStartDaemon(t, gpumemBin, other, gpu, "--socket="+first.Socket)
	if !third.Wait(30 * time.Second) {
		t.Fatal("a second daemon runs on the same socket")
	}
	if out := third.Output(); !strings.Contains(out, "another gpumem daemon is serving "+first.Socket) || !strings.Contains(out, holder) {
		t.Errorf("the daemon on a served socket does not name the one serving it, %q:\n%s", holder, out)
	}
	// The innocent: the first daemon still serves.
	if err := first.Client.Healthz(context.Background()); err != nil {
		t.Errorf("the first daemon no longer answers: %v", err)
	}
}
