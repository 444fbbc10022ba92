package adversarial

import (
	"os/exec"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// GPU work is judged per process, by the process's own readings: another
// process computing on the same GPU proves nothing about a dead kernel's
// orphan, and an idle one beside it proves nothing either.

// deadKernelBeside starts a kernel without a server, a child of it in its
// own session (what survives the kernel's death) and a process of no
// kernel; the simulated GPU lists the three with the given SM figures;
// gpumem serve follows them. It returns once the daemon attributes the
// child to the kernel, with the kernel's process not yet killed.
func deadKernelBeside(t *testing.T, orphanSM, outsiderSM uint32) (k *testenv.Kernel, d *testenv.Daemon, orphan, outsider int) {
	t.Helper()
	dir := jupyterDir(t)
	k = testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	_, orphan = spawnChildren(t, k)
	other := exec.Command("/bin/sleep", "600")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = other.Wait(); close(done) }()
	t.Cleanup(func() { _ = other.Process.Kill(); <-done })
	outsider = other.Process.Pid
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: orphan, UsedBytes: 2 << 30, SMPercent: orphanSM},
		testenv.FakeProc{PID: outsider, UsedBytes: 4 << 30, SMPercent: outsiderSM})
	d = testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms", "--reclaim-grace=500ms")
	testenv.Poll(t, 30*time.Second, "the daemon attributes the child to the kernel", func() bool {
		in, _ := kernelHolds(d.Report(t), k.ID, orphan)
		return in
	})
	return k, d, orphan, outsider
}

// A process outside the kernel's tree that computes (100 % SM on the same
// GPU) must not make the dead kernel's idle orphan look busy: the orphan is
// ended, the outsider left alone, and the notebook's figure counts none of
// the outsider's work.
func TestComputingOutsiderDoesNotSpareAnIdleOrphan(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel")
	k, d, orphan, outsider := deadKernelBeside(t, 0, 100)
	testenv.Poll(t, 15*time.Second, "the notebook's utilization: 0 % SM, the outsider's 100 % not counted", func() bool {
		for _, nb := range d.Report(t).Notebooks {
			if nb.KernelID == k.ID {
				if nb.Utilization != nil && nb.Utilization.SMPercent != 0 {
					t.Fatalf("the notebook is charged %d %% SM: the outsider's work", nb.Utilization.SMPercent)
				}
				return nb.Utilization != nil
			}
		}
		return false
	})
	if err := k.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testenv.Poll(t, 20*time.Second, "the idle orphan ended", func() bool { return !testenv.Alive(orphan) })
	if _, left := d.FindLog("orphan left running: computing", map[string]any{"pid": orphan}); left {
		t.Errorf("the idle orphan %d was judged computing", orphan)
	}
	staysAlive(t, time.Second, "the process of no kernel", outsider)
}

// The reverse: the dead kernel's orphan computes, the process beside it
// only holds memory. The orphan is left running (a training job started
// from the notebook), and so is the outsider; an older build ends the
// orphan.
func TestComputingOrphanIsLeftRunningBesideAnIdleOutsider(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel")
	k, d, orphan, outsider := deadKernelBeside(t, 90, 0)
	if err := k.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testenv.Poll(t, 20*time.Second, "the computing orphan left running", func() bool {
		if !testenv.Alive(orphan) {
			t.Fatalf("the orphan %d was ended while it computed on a GPU", orphan)
		}
		_, left := d.FindLog("orphan left running: computing", map[string]any{"pid": orphan})
		return left
	})
	staysAlive(t, 2*time.Second, "the computing orphan and the process of no kernel", orphan, outsider)
	rep := d.Report(t)
	if len(rep.LeftRunning) != 1 || rep.LeftRunning[0].PID != orphan || rep.LeftRunning[0].KernelID != k.ID {
		t.Errorf("left running %+v, want the orphan %d of kernel %s", rep.LeftRunning, orphan, k.ID)
	}
}
