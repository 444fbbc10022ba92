package adversarial

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// busyWorkersCell runs while the test frees the kernel's workers: until
// the stop file exists it writes, every 50 ms, what each worker's
// Popen.poll() says (None while it runs), as a cell that uses its workers
// sees them; then it prints the same as its last line.
const busyWorkersCell = `import json, os, pathlib, time
_deadline = time.monotonic() + 170
pathlib.Path(%[1]q).touch()
while not os.path.exists(%[2]q) and time.monotonic() < _deadline:
    with open(%[3]q + ".tmp", "w") as _f:
        _f.write(json.dumps({"busy": _busy.poll(), "idle": _idle.poll()}))
    os.replace(%[3]q + ".tmp", %[3]q)
    time.sleep(0.05)
print(json.dumps({"busy": _busy.poll(), "idle": _idle.poll()}))`

// workerStatus is what the running cell last saw of its workers: their
// return codes, nil while they run.
type workerStatus struct {
	Busy *int `json:"busy"`
	Idle *int `json:"idle"`
}

func readWorkerStatus(t *testing.T, path string) (workerStatus, bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	var st workerStatus
	if err != nil || json.Unmarshal(b, &st) != nil {
		return st, false
	}
	return st, true
}

// A kernel runs a cell that keeps one worker computing (90 % SM on the
// simulated GPU) while another only holds memory. free --children, while
// the cell runs, ends the idle worker only: the computing one runs on (the
// cell's Popen.poll() says None), and the reply names it with its SM % and
// the command that ends it; that command then ends it. Confirming pids
// never reaches beyond the kernel's tree: a worker of another kernel of
// the same user, another user's process and the kernel itself, passed to
// --pid, are left alone and said to be none of the kernel's workers. An
// older build ends the computing worker mid-cell (the cell sees -15).
func TestFreeChildrenOfABusyKernelLeavesTheComputingWorker(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	k := testenv.StartKernel(t, dir)
	k2 := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	testenv.WaitKernelListening(t, k2.ConnectionFile, 60*time.Second)
	workers := cellInts(t, k, `import json, subprocess, sys
_busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # computing worker"])
_idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # idle worker"])
print(json.dumps([_busy.pid, _idle.pid]))`)
	busy, idle := workers[0], workers[1]
	other := cellInts(t, k2, `import json, subprocess, sys
_p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps([_p.pid]))`)[0]
	killLater(t, busy, idle, other)
	u := testenv.MakeUser(t, "gmkids")
	_, theirs := pyProcAs(t, &u, "import os, time; print(os.getpid(), flush=True); time.sleep(600)")
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: busy, UsedBytes: 2 << 30, SMPercent: 90},
		testenv.FakeProc{PID: idle, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: k2.Cmd.Process.Pid, UsedBytes: 1 << 30}, testenv.FakeProc{PID: other, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: theirs[0], UsedBytes: 1 << 30})
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms")
	d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": k.ID})
	waitRecorded(t, d, k.ID, busy, idle)
	waitRecorded(t, d, k2.ID, other)

	tmp := t.TempDir()
	started, stop, status := filepath.Join(tmp, "started"), filepath.Join(tmp, "stop"), filepath.Join(tmp, "status")
	cell := make(chan testenv.CellResult, 1)
	go func() {
		cell <- testenv.RunCell(t, k.ConnectionFile, fmt.Sprintf(busyWorkersCell, started, stop, status), 180*time.Second)
	}()
	cellDone := false
	defer func() {
		if !cellDone {
			_ = os.WriteFile(stop, nil, 0o600)
			select {
			case <-cell:
			case <-time.After(60 * time.Second):
				t.Error("the cell did not end within 60 s of its stop file")
			}
		}
	}()
	testenv.Poll(t, 30*time.Second, "the cell runs and sees both workers run", func() bool {
		st, ok := readWorkerStatus(t, status)
		return ok && st.Busy == nil && st.Idle == nil
	})

	stdout, stderr, err := gpumem(t, dir, gpu, "free", k.ID, "--children")
	t.Logf("gpumem free --children while the cell runs:\n%s", stdout)
	testenv.Poll(t, 20*time.Second, "the idle worker ends", func() bool { return !testenv.Alive(idle) })
	st, _ := readWorkerStatus(t, status)
	if st.Busy != nil || !testenv.Alive(busy) {
		t.Fatalf("free --children of a busy kernel ended its computing worker %d mid-cell (the cell sees returncode %v)\n%s\n%s",
			busy, fmtRC(st.Busy), stdout, stderr)
	}
	if err != nil {
		t.Fatalf("gpumem free --children: %v\n%s\n%s", err, stdout, stderr)
	}
	staysAlive(t, time.Second, "free --children of the busy kernel", busy, k.Cmd.Process.Pid, other, theirs[0], k2.Cmd.Process.Pid)
	left := regexp.MustCompile(fmt.Sprintf(`left running: pid %d \S+ computes at 90%% SM on GPU 0; to end it: gpumem free %s --children --pid %d\n`,
		busy, regexp.QuoteMeta(k.ID), busy))
	if !left.MatchString(stdout) || !regexp.MustCompile(fmt.Sprintf(`ended pid %d .*SIGTERM`, idle)).MatchString(stdout) {
		t.Errorf("the reply does not say it ended the idle worker %d and left the computing %d running, with its SM %% and how to end it:\n%s",
			idle, busy, stdout)
	}
	// The figure after is read once the idle worker is gone from the
	// driver's list of the kernel's tree (a zombie until the cell reaps it).
	if want := "driver (NVML, read by gpumem serve): 4.0 GiB -> 3.0 GiB for this kernel (-1.0 GiB)"; !strings.Contains(stdout, want) {
		t.Errorf("the reply does not say %q:\n%s", want, stdout)
	}
	for _, pid := range []int{other, theirs[0], k2.Cmd.Process.Pid} {
		if namesPID(stdout, pid) {
			t.Errorf("the reply names pid %d, which is not the kernel's:\n%s", pid, stdout)
		}
	}

	// Confirmed pids of no worker of this kernel: nothing is ended.
	pids := fmt.Sprintf("%d,%d,%d", other, theirs[0], k.Cmd.Process.Pid)
	stdout, stderr, err = gpumem(t, dir, gpu, "free", k.ID, "--children", "--pid", pids)
	if err == nil || !strings.Contains(stderr, "3 of the 3 pids confirmed were not ended") {
		t.Errorf("free --children --pid %s: %v, want a failure saying none was ended\n%s\n%s", pids, err, stdout, stderr)
	}
	for _, pid := range []int{other, theirs[0], k.Cmd.Process.Pid} {
		if !regexp.MustCompile(fmt.Sprintf(`left pid %d .*not a process of this kernel's tree`, pid)).MatchString(stdout) {
			t.Errorf("the reply does not say pid %d is none of the kernel's workers:\n%s", pid, stdout)
		}
	}
	staysAlive(t, time.Second, "free --children --pid "+pids, busy, k.Cmd.Process.Pid, other, theirs[0], k2.Cmd.Process.Pid)
	if st, _ := readWorkerStatus(t, status); st.Busy != nil {
		t.Fatalf("the cell saw its computing worker end (%v) after free --children --pid %s", fmtRC(st.Busy), pids)
	}

	// The command the reply gave ends the computing worker, and only it.
	stdout, stderr, err = gpumem(t, dir, gpu, "free", k.ID, "--children", "--pid", fmt.Sprint(busy))
	if err != nil {
		t.Fatalf("free --children --pid %d: %v\n%s\n%s", busy, err, stdout, stderr)
	}
	testenv.Poll(t, 20*time.Second, "the confirmed computing worker ends", func() bool { return !testenv.Alive(busy) })
	if !regexp.MustCompile(fmt.Sprintf(`ended pid %d .*SIGTERM`, busy)).MatchString(stdout) ||
		!strings.Contains(stdout, "3.0 GiB -> 1.0 GiB for this kernel (-2.0 GiB)") {
		t.Errorf("the reply does not say it ended pid %d, returning its 2 GiB:\n%s", busy, stdout)
	}
	staysAlive(t, time.Second, "free --children --pid of the computing worker", k.Cmd.Process.Pid, other, theirs[0], k2.Cmd.Process.Pid)

	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := <-cell
	cellDone = true
	if r.Status != "ok" {
		t.Fatalf("the cell: %+v", r)
	}
	if r := testenv.RunCell(t, k.ConnectionFile, "print(6*7)", 30*time.Second); strings.TrimSpace(r.Stdout) != "42" {
		t.Errorf("the kernel is not usable after: %+v", r)
	}
}

func fmtRC(rc *int) string {
	if rc == nil {
		return "None"
	}
	return fmt.Sprint(*rc)
}

// %gpumem free --children from inside the kernel: a multiprocessing pool's
// worker computes (75 % SM), a subprocess only holds memory. The idle one
// is ended; the pool is not torn down (its teardown would end its computing
// worker): the worker is named with its SM % and the magic that ends it,
// and the pool still answers. Then that magic ends it. An older build
// terminates the pool.
func TestFreeChildrenMagicLeavesAComputingPoolWorker(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	k := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	pids := cellInts(t, k, `import json, multiprocessing, subprocess, sys
_pool = multiprocessing.get_context("fork").Pool(1)
_idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps([_pool._pool[0].pid, _idle.pid]))`)
	worker, idle := pids[0], pids[1]
	killLater(t, worker, idle)
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: worker, UsedBytes: 2 << 30, SMPercent: 75}, testenv.FakeProc{PID: idle, UsedBytes: 1 << 30})
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms")
	d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": k.ID})
	waitRecorded(t, d, k.ID, worker, idle)

	magic := func(args string) string {
		t.Helper()
		r := testenv.RunCell(t, k.ConnectionFile, fmt.Sprintf(`from IPython.utils.capture import capture_output
with capture_output() as _c:
    get_ipython().run_line_magic("gpumem", %q)
print("\n".join(o.data.get("text/plain", "") for o in _c.outputs))`, args), 120*time.Second)
		if r.Status != "ok" {
			t.Fatalf("%%gpumem %s: %+v", args, r)
		}
		return r.Stdout
	}
	out := magic("free --children")
	testenv.Poll(t, 20*time.Second, "the idle subprocess ends", func() bool { return !testenv.Alive(idle) })
	if !testenv.Alive(worker) {
		t.Fatalf("%%gpumem free --children ended the pool's computing worker %d:\n%s", worker, out)
	}
	left := regexp.MustCompile(fmt.Sprintf(`left running: pid %d \S+ \(multiprocessing pool worker\) computes at 75%% SM on GPU 0; `+
		`to end it: %%gpumem free --children --pid %d\n`, worker, worker))
	if !left.MatchString(out) || !strings.Contains(out, "the frameworks' teardown was not run") {
		t.Errorf("%%gpumem free --children does not name the computing pool worker %d, its SM %% and the magic that ends it:\n%s", worker, out)
	}
	if r := testenv.RunCell(t, k.ConnectionFile, "print(_pool.apply(abs, (-3,)))", 60*time.Second); strings.TrimSpace(r.Stdout) != "3" {
		t.Errorf("the pool does not answer after %%gpumem free --children: %+v", r)
	}
	staysAlive(t, time.Second, "%gpumem free --children", worker, k.Cmd.Process.Pid)

	out = magic(fmt.Sprintf("free --children --pid %d", worker))
	testenv.Poll(t, 20*time.Second, "the confirmed pool worker ends", func() bool { return !testenv.Alive(worker) })
	if !regexp.MustCompile(fmt.Sprintf(`%d .*SIGTERM`, worker)).MatchString(out) {
		t.Errorf("%%gpumem free --children --pid %d does not say it ended it:\n%s", worker, out)
	}
	if !testenv.Alive(k.Cmd.Process.Pid) {
		t.Fatal("the kernel itself was ended")
	}
}
