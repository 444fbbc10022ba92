package serve

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// Culling counts work on a GPU as use: two idle kernels hold GPU memory and
// are warned; then a detached child of the first starts to compute. Its
// warning is withdrawn and it is never culled, whatever its server's
// last_activity says; the second, which only holds memory, is shut down.
func TestGPUCullSparesAKernelWhoseChildComputes(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	trains := openNotebook(t, srv, "cull/trains.ipynb")
	holds := openNotebook(t, srv, "cull/holds.ipynb")
	job := trains.startOrphanable(t)
	gpu := testenv.NewFakeGPU(t)
	idle := []testenv.FakeProc{{PID: trains.pid, UsedBytes: 2 << 30}, {PID: job, UsedBytes: 1 << 30}, {PID: holds.pid, UsedBytes: 2 << 30}}
	gpu.Set(t, idle...)
	d := startDaemon(t, srv, gpu, "--interval=200ms", "--rescan=300ms", "--cull-idle=2s", "--cull-warn=4s",
		"--cull-min-memory=1GiB", "--cull-action=shutdown", "--reclaim-grace=500ms")
	tk, hk := trains.sess.Kernel.ID, holds.sess.Kernel.ID
	d.WaitLog(t, 60*time.Second, "idle kernel holds GPU memory: warned", map[string]any{"kernel_id": tk})

	computing := append([]testenv.FakeProc(nil), idle...)
	computing[1].SMPercent = 80
	gpu.Set(t, computing...)
	d.WaitLog(t, 10*time.Second, "cull cancelled", map[string]any{"kernel_id": tk, "reason": "its processes computed on a GPU since the warning"})
	d.WaitLog(t, 60*time.Second, "idle kernel holding GPU memory shut down through its server", map[string]any{"kernel_id": hk})

	cmd := exec.Command(gpumemBin, "ls", "--idle")
	cmd.Env = testenv.Env(srv.Dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpumem ls --idle: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "trains.ipynb") && !strings.Contains(line, "computing") {
			t.Errorf("ls --idle does not show the kernel computing: %q", line)
		}
	}
	// Idle 2 s and warned 4 s, twice over: a cull would have come.
	deadline := time.Now().Add(12 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := d.FindLog("idle kernel holding GPU memory shut down through its server", map[string]any{"kernel_id": tk}); ok {
			t.Fatal("the kernel whose child computes was shut down")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !contains(serverKernels(t, srv), tk) || !testenv.Alive(trains.pid) || !testenv.Alive(job) {
		t.Fatalf("the computing notebook's kernel or job is gone (kernels %v)", serverKernels(t, srv))
	}
	for _, nb := range d.Report(t).Notebooks {
		if nb.KernelID == tk && (nb.Activity == nil || nb.Activity.IdleSeconds > 2) {
			t.Errorf("its idle figure ignores its work on the GPU: %+v", nb.Activity)
		}
	}
}
