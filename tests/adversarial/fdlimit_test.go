package adversarial

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem/internal/testenv"
)

// A daemon out of file descriptors cannot read /proc, and a failed read is
// no exit: with RLIMIT_NOFILE at 40 and bursts of connections to its
// socket taking the rest, a sleeping kernel is never taken for dead and
// its worker holding 3 GiB is never ended. Once the bursts stop the daemon
// sees the kernel's tree again, and a real kill of the kernel is still
// followed by the reclaim of its worker.
func TestFailedProcReadIsNoExit(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	k := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	worker, ownSession := spawnChildren(t, k)
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: worker, UsedBytes: 3 << 30}, testenv.FakeProc{PID: ownSession, UsedBytes: 1 << 30})
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms", "--reclaim-grace=500ms")
	testenv.Poll(t, 30*time.Second, "the daemon attributes the worker to the kernel", func() bool {
		under, _ := kernelHolds(d.Report(t), k.ID, worker)
		return under
	})

	daemonPID := d.Cmd.Process.Pid
	open := func() int {
		entries, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(daemonPID), "fd"))
		if err != nil {
			t.Fatal(err)
		}
		return len(entries)
	}
	const limit = 40
	if n := open(); n >= limit-5 {
		t.Fatalf("the daemon holds %d descriptors already: a limit of %d leaves it nothing to work with", n, limit)
	}
	if err := unix.Prlimit(daemonPID, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatalf("prlimit the daemon to %d descriptors: %v", limit, err)
	}

	// Bursts of connections: each takes every descriptor left and a few
	// more, then gives them back one per sample interval, so that the
	// daemon samples again and again with a handful of descriptors free:
	// enough to read the GPUs and start reading /proc, not enough to read
	// all of it.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			var conns []net.Conn
			for range limit + 5 {
				c, err := net.DialTimeout("unix", d.Socket, time.Second)
				if err != nil {
					break
				}
				conns = append(conns, c)
			}
			for i := len(conns); i >= 0; i-- {
				select {
				case <-stop:
					for _, c := range conns[:i] {
						c.Close()
					}
					return
				case <-time.After(100 * time.Millisecond):
				}
				if i > 0 {
					conns[i-1].Close()
				}
			}
		}
	})
	starved := false
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if !testenv.Alive(worker) || !testenv.Alive(ownSession) {
			close(stop)
			wg.Wait()
			t.Fatalf("a live kernel's worker was ended while the daemon could not read /proc")
		}
		starved = starved || strings.Contains(d.Output(), "too many open files")
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if _, ok := d.FindLog("kernel process exited", nil); ok {
		t.Fatalf("a sleeping kernel was taken for dead while the daemon could not read /proc")
	}
	if _, ok := d.FindLog("ending orphan that holds GPU memory (SIGTERM)", nil); ok {
		t.Fatal("the daemon tried to end a live kernel's worker")
	}
	if !starved {
		t.Fatalf("the daemon never ran out of descriptors: the test proves nothing\n%s", lastLines(d.Output(), 40))
	}

	// Descriptors again: the same tree, and a real exit still reclaims.
	testenv.Poll(t, 30*time.Second, "the daemon attributes the worker to the kernel again", func() bool {
		under, _ := kernelHolds(d.Report(t), k.ID, worker)
		return under
	})
	if err := k.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.WaitLog(t, 15*time.Second, "kernel process exited", map[string]any{"kernel_id": k.ID})
	d.WaitLog(t, 15*time.Second, "orphan ended", map[string]any{"pid": worker})
	testenv.Poll(t, 15*time.Second, "the dead kernel's worker is reclaimed", func() bool {
		return !testenv.Alive(worker) && !testenv.Alive(ownSession)
	})
}

// lastLines is the end of a log, for a failure message.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
