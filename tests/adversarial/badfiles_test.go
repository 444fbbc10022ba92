package adversarial

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// Files named like Jupyter's that are FIFOs or devices: opening a FIFO
// blocks until a writer comes, and /dev/zero never ends. The CLI answers at
// once with an error naming each file.
func TestFIFOsAndDevicesInRuntimeDir(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	rt := filepath.Join(dir, "runtime")
	for _, name := range []string{"kernel-x.json", "nbserver-1.json"} {
		if err := syscall.Mkfifo(filepath.Join(rt, name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/dev/zero", filepath.Join(rt, "jpserver-2.json")); err != nil {
		t.Fatal(err)
	}
	wants := []string{"kernel-x.json: not a regular file (a FIFO)", "nbserver-1.json: not a regular file (a FIFO)",
		"jpserver-2.json: a symbolic link, not followed"}
	// The device itself (/dev/zero's numbers), where a link is not followed.
	if os.Geteuid() == 0 {
		if err := syscall.Mknod(filepath.Join(rt, "jpserver-3.json"), syscall.S_IFCHR|0o600, 1<<8|5); err != nil {
			t.Fatal(err)
		}
		wants = append(wants, "jpserver-3.json: not a regular file (a character device)")
	}
	for _, args := range [][]string{{"kernels"}, {"ls"}} {
		start := time.Now()
		_, stderr, _ := gpumem(t, dir, testenv.NewFakeGPU(t), args...)
		for _, want := range wants {
			if !strings.Contains(stderr, want) {
				t.Errorf("gpumem %v: stderr lacks %q:\n%s", args, want, stderr)
			}
		}
		t.Logf("gpumem %v answered in %v", args, time.Since(start))
	}
}

// A FIFO created while the daemon runs freezes nothing: scans, samples and
// the API go on.
func TestFIFOWhileDaemonRuns(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	gpu := testenv.NewFakeGPU(t)
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms")
	rt := filepath.Join(dir, "runtime")
	for _, name := range []string{"kernel-x.json", "jpserver-1.json"} {
		if err := syscall.Mkfifo(filepath.Join(rt, name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d.WaitLog(t, 15*time.Second, "discovery", map[string]any{"error": "~kernel-x.json: not a regular file (a FIFO)"})
	// Sampling goes on: a process added to the simulated GPU shows up.
	_, nums := pyProc(t, "import os, time; print(os.getpid(), flush=True); time.sleep(600)")
	gpu.Set(t, testenv.FakeProc{PID: nums[0], UsedBytes: 1 << 30})
	testenv.Poll(t, 15*time.Second, "a new GPU process in the report", func() bool {
		_, other := kernelHolds(d.Report(t), "", nums[0])
		return other
	})
	// Scans go on: a server file written now is read (and its dead server
	// reported), behind the FIFO in the same dir.
	if err := os.WriteFile(filepath.Join(rt, "jpserver-99.json"), []byte(`{"url":"http://127.0.0.1:9/","token":"t","root_dir":"/","pid":99}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d.WaitLog(t, 15*time.Second, "discovery", map[string]any{"error": "~127.0.0.1:9"})
}

// A server file linked to /dev/zero is refused at once, whatever it would
// yield: nothing grows.
func TestServerFileLinkedToDevZero(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "runtime", "jpserver-1.json")); err != nil {
		t.Fatal(err)
	}
	gpu := testenv.NewFakeGPU(t)
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms")
	d.WaitLog(t, 15*time.Second, "discovery", map[string]any{"error": "~jpserver-1.json: a symbolic link, not followed"})
	rss, _, err := testenv.ProcMemory(d.Cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if rss > 200<<20 {
		t.Errorf("daemon RSS %d MiB after reading a /dev/zero server file", rss>>20)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.Client.Healthz(ctx); err != nil {
		t.Fatal(err)
	}
}
