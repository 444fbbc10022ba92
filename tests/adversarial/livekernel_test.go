package adversarial

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// spawnChildren starts, inside the kernel, a plain child and one in a new
// session (Jupyter's process-group kill misses that one), and returns their
// pids.
func spawnChildren(t *testing.T, k *testenv.Kernel) (plain, ownSession int) {
	t.Helper()
	r := testenv.RunCell(t, k.ConnectionFile, "import subprocess\n"+
		"_a = subprocess.Popen(['sleep', '600'])\n"+
		"_b = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"+
		"print(_a.pid, _b.pid)", 60*time.Second)
	f := strings.Fields(r.Stdout)
	if r.Status != "ok" || len(f) != 2 {
		t.Fatalf("spawning children: %+v", r)
	}
	plain, _ = strconv.Atoi(f[0])
	ownSession, _ = strconv.Atoi(f[1])
	killLater(t, plain, ownSession)
	return plain, ownSession
}

// liveKernelWithChildren starts a kernel without a server in a runtime dir
// and gpumem serve beside it, and waits until the daemon has recorded both
// children in the kernel's tree.
func liveKernelWithChildren(t *testing.T) (dir string, k *testenv.Kernel, d *testenv.Daemon, plain, ownSession int) {
	t.Helper()
	dir = jupyterDir(t)
	k = testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	plain, ownSession = spawnChildren(t, k)
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: plain, UsedBytes: 1 << 29}, testenv.FakeProc{PID: ownSession, UsedBytes: 1 << 28})
	d = testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms", "--reclaim-grace=500ms")
	testenv.Poll(t, 30*time.Second, "the daemon attributes both children to the kernel", func() bool {
		rep := d.Report(t)
		a, _ := kernelHolds(rep, k.ID, plain)
		b, _ := kernelHolds(rep, k.ID, ownSession)
		return a && b
	})
	return dir, k, d, plain, ownSession
}

// Deleting a live kernel's connection file (rm, a tmp cleaner) ends
// nothing: the kernel is over only when its process is. Once the process
// dies, its orphans holding GPU memory are reclaimed as after a shutdown.
func TestConnectionFileRemovedUnderLiveKernel(t *testing.T) {
	t.Parallel()
	_, k, d, plain, ownSession := liveKernelWithChildren(t)
	if err := os.Remove(k.ConnectionFile); err != nil {
		t.Fatal(err)
	}
	// The daemon looks again missingGrace (300 ms) after it first misses
	// the file, then samples every 100 ms: 3 s is ample time to do harm.
	staysAlive(t, 3*time.Second, "child of a live kernel whose connection file was removed", plain, ownSession)
	d.WaitLog(t, 15*time.Second, "connection file removed while the kernel process runs: its processes stay protected until it exits",
		map[string]any{"kernel_id": k.ID})
	rep := d.Report(t)
	if a, _ := kernelHolds(rep, k.ID, plain); !a {
		t.Errorf("after the file went, the report no longer lists child %d under the live kernel", plain)
	}

	// Now the kernel process dies: a shutdown, and its orphans go.
	if err := k.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.WaitLog(t, 15*time.Second, "kernel process exited", map[string]any{"kernel_id": k.ID, "after": "shutdown"})
	testenv.Poll(t, 15*time.Second, "the dead kernel's orphans are reclaimed", func() bool {
		return !testenv.Alive(plain) && !testenv.Alive(ownSession)
	})
}

// Deleting the whole runtime dir under a running daemon: the kernel's
// children live on, and the daemon serves its socket again where clients
// look for it.
func TestRuntimeDirDeletedUnderLiveKernel(t *testing.T) {
	t.Parallel()
	dir, k, d, plain, ownSession := liveKernelWithChildren(t)
	// The daemon watches the dir and may serve its socket in it again
	// while RemoveAll empties it, which then cannot remove the dir
	// itself: what matters is that the connection file went with the rest.
	if err := os.RemoveAll(filepath.Join(dir, "runtime")); err != nil && !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatal(err)
	}
	if _, err := os.Stat(k.ConnectionFile); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("connection file %s still there after deleting its dir: %v", k.ConnectionFile, err)
	}
	staysAlive(t, 3*time.Second, "child of a live kernel whose runtime dir was deleted", plain, ownSession)
	d.WaitLog(t, 15*time.Second, "connection file removed while the kernel process runs: its processes stay protected until it exits",
		map[string]any{"kernel_id": k.ID})
	testenv.Poll(t, 15*time.Second, "the daemon's socket answers again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return d.Client.Healthz(ctx) == nil
	})
	if d.Exited() {
		t.Fatalf("the daemon exited:\n%s", d.Output())
	}
}
