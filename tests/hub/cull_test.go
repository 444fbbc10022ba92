package hub

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// TestHubCullArbiter: jupyterhub-idle-culler 2.0 (the hashed lock's) with
// jupyterlab_gpumem.hub's arbiter, set by the documented config line,
// against a real JupyterHub, four real users' JupyterLab servers and the
// root daemon in shared mode. The culler's cull_idle runs in process with
// its clock moved forward as the culler's own tests move it: hours of
// idleness take seconds.
//   - The culler's rule (1 h): the idle user holding 12 GiB is culled; the
//     trainer, whose notebook's tab is closed (no activity at all) while a
//     worker in its kernel's tree computes, is vetoed with the daemon's
//     reason, however long the inactivity.
//   - The GPU-idle rule (1 h, 4 GiB; culler's rule at 8 h): the hoarder,
//     whose notebook runs a keep-alive cell every 2 s but holds 8 GiB with
//     no GPU work, is culled 2 h on; the user holding 1 GiB is not, nor the
//     trainer.
//   - A culler that is not the daemon's admin (run as a user) vetoes every
//     cull and says to run it as root.
//   - The daemon stopped: every cull is vetoed, and the log says why.
func TestHubCullArbiter(t *testing.T) {
	need(t, os.Geteuid() == 0, "the JupyterHub test runs as root (useradd, spawning as other users)")
	testenv.Require(t, "jupyter_client")
	trainer, idler := testenv.MakeUser(t, "train"), testenv.MakeUser(t, "idle")
	hoarder, small := testenv.MakeUser(t, "hoard"), testenv.MakeUser(t, "small")
	h := startHub(t, trainer, idler, hoarder, small)
	c := newCuller(t, h)

	// Only the trainer and the idle user have servers in the first round:
	// the others would be culled by the culler's 1 h rule too.
	h.startServers(t, trainer, idler)
	nbT := h.openNotebook(t, trainer, "train.ipynb")
	workerT := nbT.childInOwnSession(t)
	nbI := h.openNotebook(t, idler, "idle.ipynb")

	sock := sharedSocket(t)
	gpu := testenv.NewFakeGPU(t)
	training := []testenv.FakeProc{{PID: nbT.pid, UsedBytes: 2 * gib}, {PID: workerT, UsedBytes: 20 * gib, SMPercent: 90, MemoryPercent: 40}}
	gpu.Set(t, append(training, testenv.FakeProc{PID: nbI.pid, UsedBytes: 12 * gib})...)
	// A 5 s compute window: verdicts settle within seconds.
	d := testenv.StartDaemon(t, gpumemBin, t.TempDir(), gpu, "--all-users", "--reclaim-all-users",
		"--users="+trainer.Name, "--users="+idler.Name, "--users="+hoarder.Name, "--users="+small.Name,
		"--socket="+sock, "--socket-mode=shared", "--interval=500ms", "--compute-window=5s")
	waitVerdicts(t, d, map[string]string{nbT.kernelID: attribution.ComputeComputing, nbI.kernelID: attribution.ComputeIdle})

	arbiter := c.config(t, "culler_rule", fmt.Sprintf("socket=%q", sock))
	gpuIdle := c.config(t, "culler_gpu_idle", fmt.Sprintf("socket=%q, gpu_idle_after=3600, gpu_idle_min_bytes=4 << 30", sock))

	t.Run("the culler's rule culls the idle holder, never the training", func(t *testing.T) {
		out := c.rounds(t, nil, arbiter, time.Hour, 2*time.Hour, 30*time.Hour)
		t.Logf("culler:\n%s", out)
		testenv.Poll(t, 60*time.Second, idler.Name+"'s server stopped", func() bool { return !h.serverRunning(t, idler) })
		testenv.Poll(t, 30*time.Second, idler.Name+"'s kernel ended with its server", func() bool { return !testenv.Alive(nbI.pid) })
		mustLog(t, out, `gpumem: allow cull of `+idler.Name+`/: inactive for 02:00:\d\d \(limit 01:00:00\).*\[user=`+idler.Name+` server=`+idler.Name+`/ gpu_memory_bytes=12884901888 verdicts=idle rule=culler\]`)
		mustLog(t, out, `Culling server `+idler.Name+` \(inactive for 02:00:`)
		// Vetoed in both rounds, 30 h on too, with the daemon's reason.
		veto := `gpumem: veto cull of ` + trainer.Name + `/: kernel ` + nbT.kernelID + ` \(.*train.ipynb\) computes on a GPU: .*\[user=` + trainer.Name + ` server=` + trainer.Name + `/ gpu_memory_bytes=23622320128 verdicts=computing rule=veto\]`
		if n := len(regexp.MustCompile(veto).FindAllString(out, -1)); n != 2 {
			t.Errorf("the trainer's veto logged %d times in 2 rounds, want 2", n)
		}
		trainerUnharmed(t, h, trainer, nbT, workerT)
	})

	h.startServers(t, hoarder, small)
	nbH := h.openNotebook(t, hoarder, "hoard.ipynb")
	nbS := h.openNotebook(t, small, "small.ipynb")
	gpu.Set(t, append(training, testenv.FakeProc{PID: nbH.pid, UsedBytes: 8 * gib}, testenv.FakeProc{PID: nbS.pid, UsedBytes: 1 * gib})...)
	keep := nbH.keepAlive(t)
	waitVerdicts(t, d, map[string]string{nbT.kernelID: attribution.ComputeComputing, nbH.kernelID: attribution.ComputeIdle, nbS.kernelID: attribution.ComputeIdle})

	t.Run("a user who is not the daemon's admin vetoes every cull", func(t *testing.T) {
		out := c.rounds(t, &small, arbiter, time.Hour, 30*time.Hour)
		t.Logf("culler as %s:\n%s", small.Name, out)
		for _, u := range []testenv.User{trainer, hoarder, small} {
			mustLog(t, out, `gpumem: veto cull of `+u.Name+`/: the gpumem daemon shows this culler only its own user's kernels: run the culler as root`)
			if !h.serverRunning(t, u) {
				t.Errorf("%s's server was culled by a culler that could not see its kernels", u.Name)
			}
		}
	})

	t.Run("the GPU-idle rule culls the hoarder despite its keep-alive, not the small holder", func(t *testing.T) {
		// A keep-alive cell may be running when the arbiter asks (it then
		// vetoes, rightly): a few tries.
		culled := regexp.MustCompile(`gpumem: cull ` + hoarder.Name + `/: holds 8589934592 bytes of GPU memory \(at least 4294967296\) and computed nothing on any GPU for 02:00:\d\d \(limit 01:00:00\) \[user=` + hoarder.Name + ` server=` + hoarder.Name + `/ gpu_memory_bytes=8589934592 verdicts=idle rule=gpu-idle\]`)
		var out string
		for try := 1; try <= 3; try++ {
			// The keep-alive is live as the culler asks: a cell of it has
			// just run (it runs one every 2 s until its kernel ends).
			cells := strings.Count(keep.Output(), " ok\n")
			testenv.Poll(t, 30*time.Second, "a keep-alive cell before the culler's rounds", func() bool {
				return strings.Count(keep.Output(), " ok\n") > cells
			})
			// The culler's rule at 8 h: only the GPU-idle rule can cull.
			// The first round sees the hoarder idle, the second 2 h on.
			out = c.rounds(t, nil, gpuIdle, 8*time.Hour, 0, 2*time.Hour)
			t.Logf("culler, try %d:\n%s", try, out)
			if culled.MatchString(out) {
				break
			}
		}
		if !culled.MatchString(out) {
			t.Fatalf("the arbiter did not cull the hoarder in 3 tries")
		}
		testenv.Poll(t, 60*time.Second, hoarder.Name+"'s server stopped", func() bool { return !h.serverRunning(t, hoarder) })
		mustLog(t, out, `gpumem: keep `+hoarder.Name+`/: inactive for 00:0\d:\d\d \(limit 08:00:00\); GPU-idle rule: computed nothing for 00:00:\d\d of 01:00:00`)
		mustLog(t, out, `gpumem: keep `+small.Name+`/: inactive for 02:0\d:\d\d \(limit 08:00:00\); GPU-idle rule: holds 1073741824 bytes, less than 4294967296`)
		if strings.Contains(keep.Output(), " error") {
			t.Errorf("a keep-alive cell failed:\n%s", keep.Output())
		}
		testenv.Poll(t, 30*time.Second, hoarder.Name+"'s kernel ended with its server", func() bool { return !testenv.Alive(nbH.pid) })
		if !h.serverRunning(t, small) || !testenv.Alive(nbS.pid) {
			t.Errorf("the small holder's server or kernel was ended")
		}
		trainerUnharmed(t, h, trainer, nbT, workerT)
	})

	t.Run("the daemon stopped: every cull is vetoed, saying why", func(t *testing.T) {
		d.Stop(syscall.SIGTERM)
		// 30 h on, the culler's rule at 1 h: both would be culled.
		out := c.rounds(t, nil, gpuIdle, time.Hour, 30*time.Hour)
		t.Logf("culler:\n%s", out)
		mustLog(t, out, `gpumem: nothing serves `+regexp.QuoteMeta(sock)+` .*: start the root daemon .*; every cull is vetoed until the daemon answers`)
		for _, u := range []testenv.User{trainer, small} {
			mustLog(t, out, `gpumem: veto cull of `+u.Name+`/: cannot ask the gpumem daemon, so nothing is culled: nothing serves `+regexp.QuoteMeta(sock))
			if !h.serverRunning(t, u) {
				t.Errorf("%s's server was culled while the daemon could not be asked", u.Name)
			}
		}
		if strings.Contains(out, "Culling server") {
			t.Errorf("the culler culled a server without the daemon:\n%s", out)
		}
		trainerUnharmed(t, h, trainer, nbT, workerT)
	})
}

// waitVerdicts waits (60 s) until the daemon judges each kernel as want
// says and sees it idle (the arbiter needs both; the daemon's own code on
// attach keeps a kernel busy for a while on a loaded machine).
func waitVerdicts(t *testing.T, d *testenv.Daemon, want map[string]string) {
	t.Helper()
	var last []attribution.Notebook
	if testenv.Eventually(60*time.Second, func() bool {
		last = d.Report(t).Notebooks
		ok := 0
		for _, nb := range last {
			// Its process proven and on the GPU: a notebook whose process
			// is not known yet is "idle: no process on a GPU" too.
			if w, in := want[nb.KernelID]; in && nb.Compute != nil && nb.Compute.State == w && nb.Activity != nil &&
				nb.Activity.ExecutionState == "idle" && len(nb.PIDs) > 0 && nb.GPUMemoryBytes > 0 {
				ok++
			}
		}
		return ok == len(want)
	}) {
		return
	}
	for _, nb := range last {
		t.Logf("kernel %s of %s: compute %+v activity %+v", nb.KernelID, nb.User, nb.Compute, nb.Activity)
	}
	t.Fatalf("timed out after 60 s waiting for the daemon's verdicts %v on idle kernels", want)
}

// trainerUnharmed checks that the trainer's server, kernel and computing
// worker all still run.
func trainerUnharmed(t *testing.T, h *hub, trainer testenv.User, nb *notebook, worker int) {
	t.Helper()
	if !h.serverRunning(t, trainer) {
		t.Errorf("the trainer's server was culled while its notebook trained")
	}
	for _, pid := range []int{nb.pid, worker} {
		if !testenv.Alive(pid) {
			t.Errorf("the trainer's process %d was ended", pid)
		}
	}
}

func mustLog(t *testing.T, out, re string) {
	t.Helper()
	if !regexp.MustCompile(re).MatchString(out) {
		t.Errorf("the culler's log has no line matching %s", re)
	}
}
