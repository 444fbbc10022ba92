package serve

import (
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// A notebook starts a detached job that trains (it computes on the GPU)
// and a worker that only holds memory. After a restart through the
// server's REST API the worker is ended, the job is left running (logged,
// listed with its sentence, shown by gpumem ls), and its user ends it with
// gpumem free KERNEL --orphans.
func TestServeLeavesAComputingJobRunning(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	gpu := testenv.NewFakeGPU(t)
	d := startDaemon(t, srv, gpu, "--interval=200ms", "--reclaim-grace=1s")
	nb := openNotebook(t, srv, "work/train.ipynb")
	nb.waitMagic(t, 10*time.Second)
	job := nb.startOrphanable(t)
	worker := nb.startOrphanable(t)
	gpu.Set(t, testenv.FakeProc{PID: nb.pid, UsedBytes: 600 << 20},
		testenv.FakeProc{PID: job, UsedBytes: 20 << 30, SMPercent: 97, MemoryPercent: 30},
		testenv.FakeProc{PID: worker, UsedBytes: 1 << 30})
	waitNotebookHas(t, d, nb.sess.Kernel.ID, job)
	waitNotebookHas(t, d, nb.sess.Kernel.ID, worker)

	srv.JSON(t, http.MethodPost, "api/kernels/"+nb.sess.Kernel.ID+"/restart", nil, nil)
	testenv.Poll(t, 20*time.Second, "the worker "+strconv.Itoa(worker)+" ended", func() bool {
		if !testenv.Alive(job) {
			t.Fatalf("the training job %d was ended", job)
		}
		return !testenv.Alive(worker)
	})
	d.WaitLog(t, 10*time.Second, "orphan left running: computing", map[string]any{"pid": job, "kernel_id": nb.sess.Kernel.ID})
	if !testenv.Alive(job) {
		t.Fatalf("the training job %d was ended", job)
	}
	var msg string
	testenv.Poll(t, 10*time.Second, "the report lists the job left running", func() bool {
		for _, lr := range d.Report(t).LeftRunning {
			if lr.PID == job {
				msg = lr.Message
				return true
			}
		}
		return false
	})
	want := "a job started from train.ipynb (pid " + strconv.Itoa(job) + ", `"
	if !strings.HasPrefix(msg, want) || !strings.HasSuffix(msg, "is still computing on GPU 0 with 20.0 GiB: left running") {
		t.Errorf("message %q, want %q…is still computing on GPU 0 with 20.0 GiB: left running", msg, want)
	}
	// The daemon's sentence whole with --wide (the default table breaks it
	// to fit 100 columns).
	ls := exec.Command(gpumemBin, "ls", "--wide")
	ls.Env = testenv.Env(srv.Dir)
	out, err := ls.CombinedOutput()
	if err != nil || !strings.Contains(string(out), msg) || !strings.Contains(string(out), "SM") {
		t.Errorf("gpumem ls --wide: %v\n%s", err, out)
	}

	free := func(args ...string) (string, error) {
		cmd := exec.Command(gpumemBin, append([]string{"free"}, args...)...)
		cmd.Env = testenv.Env(srv.Dir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := free("nosuchkernel", "--orphans"); err == nil || !strings.Contains(out, "no kernel with processes left running matches") {
		t.Errorf("free --orphans of an unknown kernel: %v\n%s", err, out)
	}
	if !testenv.Alive(job) {
		t.Fatal("the job was ended by a request naming another kernel")
	}
	out2, err := free("train.ipynb", "--orphans")
	if err != nil || !strings.Contains(out2, "pid "+strconv.Itoa(job)+": ended") {
		t.Fatalf("free train.ipynb --orphans: %v\n%s", err, out2)
	}
	testenv.Poll(t, 10*time.Second, "the job ended on request", func() bool { return !testenv.Alive(job) })
	d.WaitLog(t, 5*time.Second, "process left running ended on request", map[string]any{"pid": job})
}
