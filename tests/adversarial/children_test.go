package adversarial

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// cellInts runs code in the kernel and returns the integers its last line
// printed as a JSON list.
func cellInts(t *testing.T, k *testenv.Kernel, code string) []int {
	t.Helper()
	r := testenv.RunCell(t, k.ConnectionFile, code, 120*time.Second)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	var out []int
	if r.Status != "ok" || json.Unmarshal([]byte(lines[len(lines)-1]), &out) != nil {
		t.Fatalf("cell %q: %+v", code, r)
	}
	return out
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitRecorded waits until the daemon's report puts each pid under the
// kernel's notebook: it has sampled them in the kernel's tree.
func waitRecorded(t *testing.T, d *testenv.Daemon, kernelID string, pids ...int) {
	t.Helper()
	testenv.Poll(t, 30*time.Second, fmt.Sprintf("the daemon attributes %v to kernel %s", pids, kernelID), func() bool {
		rep := d.Report(t)
		for _, pid := range pids {
			if under, _ := kernelHolds(rep, kernelID, pid); !under {
				return false
			}
		}
		return true
	})
}

// free --children ends the GPU-holding processes of the kernel's tree and
// nothing else: not the kernel itself (which holds GPU memory too), not a
// child of another kernel, not an unrelated process of the same user, even
// though all of them hold memory on the same GPU.
func TestFreeChildrenLeavesOthersAlone(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	k1 := testenv.StartKernel(t, dir)
	k2 := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k1.ConnectionFile, 60*time.Second)
	testenv.WaitKernelListening(t, k2.ConnectionFile, 60*time.Second)
	const spawnChild = `import json, subprocess, sys
_p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps([_p.pid]))`
	mine := cellInts(t, k1, spawnChild)[0]
	theirs := cellInts(t, k2, spawnChild)[0]
	killLater(t, mine, theirs)
	_, unrelated := pyProc(t, "import os, time; print(os.getpid(), flush=True); time.sleep(600)")
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: k1.Cmd.Process.Pid, UsedBytes: 2 << 30}, testenv.FakeProc{PID: mine, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: k2.Cmd.Process.Pid, UsedBytes: 2 << 30}, testenv.FakeProc{PID: theirs, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: unrelated[0], UsedBytes: 1 << 30})
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms")
	d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": k1.ID})
	waitRecorded(t, d, k1.ID, mine)
	waitRecorded(t, d, k2.ID, theirs)

	stdout, stderr, err := gpumem(t, dir, gpu, "free", k1.ID, "--children")
	if err != nil {
		t.Fatalf("gpumem free --children: %v\n%s\n%s\n%s", err, stdout, stderr, d.Output())
	}
	testenv.Poll(t, 20*time.Second, "kernel 1's child ends", func() bool { return !testenv.Alive(mine) })
	staysAlive(t, 2*time.Second, "free --children of kernel 1", k1.Cmd.Process.Pid, theirs, unrelated[0], k2.Cmd.Process.Pid)
	if !namesPID(stdout, mine) || !strings.Contains(stdout, "SIGTERM") {
		t.Errorf("the report does not say it ended pid %d:\n%s", mine, stdout)
	}
	for _, pid := range []int{theirs, unrelated[0], k2.Cmd.Process.Pid} {
		if namesPID(stdout, pid) {
			t.Errorf("the report names pid %d, which is not kernel 1's:\n%s", pid, stdout)
		}
	}
	if r := testenv.RunCell(t, k1.ConnectionFile, "print(6*7)", 30*time.Second); strings.TrimSpace(r.Stdout) != "42" {
		t.Errorf("kernel 1 is not usable after: %+v", r)
	}
	// Without the daemon, --children refuses and says why.
	d.Stop(syscall.SIGTERM)
	_, stderr, err = gpumem(t, dir, gpu, "free", k2.ID, "--children")
	if err == nil || !strings.Contains(stderr, "needs gpumem serve") {
		t.Errorf("free --children without a daemon: %v\n%s", err, stderr)
	}
	staysAlive(t, time.Second, "free --children without a daemon", theirs)
}

// A DataLoader's persistent workers and a spawned worker, each holding GPU
// memory, are ended by free --children: the workers through the
// DataLoader's own shutdown, the spawned one by signal; the kernel lives
// on and its DataLoader starts new workers on the next epoch. Then
// %gpumem free --children, from inside the kernel, ends the new workers.
func TestFreeChildrenEndsWorkers(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "torch")
	dir := jupyterDir(t)
	k := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	workers := cellInts(t, k, `import json, multiprocessing, time, torch
from torch.utils.data import DataLoader, TensorDataset
dl = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2, persistent_workers=True)
epoch = sum(float(b[0].sum()) for b in dl)
_spawned = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
_spawned.start()
print(json.dumps([w.pid for w in dl._iterator._workers] + [_spawned.pid]))`)
	if len(workers) != 3 {
		t.Fatalf("want 2 DataLoader workers and a spawned process, got %v", workers)
	}
	killLater(t, workers...)
	gpu := testenv.NewFakeGPU(t)
	procs := []testenv.FakeProc{{PID: k.Cmd.Process.Pid, UsedBytes: 2 << 30}}
	for _, pid := range workers {
		procs = append(procs, testenv.FakeProc{PID: pid, UsedBytes: 768 << 20})
	}
	gpu.Set(t, procs...)
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms")
	d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": k.ID})
	waitRecorded(t, d, k.ID, workers...)

	stdout, stderr, err := gpumem(t, dir, gpu, "free", k.ID, "--children")
	if err != nil {
		t.Fatalf("gpumem free --children: %v\n%s\n%s", err, stdout, stderr)
	}
	for _, pid := range workers {
		testenv.Poll(t, 20*time.Second, fmt.Sprintf("worker %d ends", pid), func() bool { return !testenv.Alive(pid) })
	}
	if !strings.Contains(stdout, "DataLoader iterator: _shutdown_workers()") || !strings.Contains(stdout, "SIGTERM") {
		t.Errorf("the report does not say the DataLoader shut its workers down and the spawned one got SIGTERM:\n%s", stdout)
	}
	if !testenv.Alive(k.Cmd.Process.Pid) {
		t.Fatal("the kernel itself was ended")
	}
	// The next epoch starts new workers; then the notebook ends them itself.
	again := cellInts(t, k, `epoch2 = sum(float(b[0].sum()) for b in dl)
assert epoch2 == epoch, (epoch, epoch2)
print(json.dumps([w.pid for w in dl._iterator._workers]))`)
	killLater(t, again...)
	procs = procs[:1]
	for _, pid := range again {
		procs = append(procs, testenv.FakeProc{PID: pid, UsedBytes: 768 << 20})
	}
	gpu.Set(t, procs...)
	waitRecorded(t, d, k.ID, again...)
	// The kernel runs its teardown before it asks the daemon; here the
	// daemon samples in between (the teardown waits for a sample without
	// the workers), which must not hide what the teardown ended.
	r := testenv.RunCell(t, k.ConnectionFile, fmt.Sprintf(`import time
from IPython.utils.capture import capture_output
import sys
_m = sys.modules["_gpumem_magics"]
_d, _st, _w = _m.daemon, _m.state, _m.workers
_teardown = _w.teardown
def _teardown_then_a_sample():
    td = _teardown()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = _d.sidecar_get("/api/v1/kernels/" + _st.config["kernel_id"], 5)
        if status == 200 and not set(json.loads(body)["pids"]) & set(%s):
            return td
        time.sleep(0.05)
    raise AssertionError("no sample of gpumem serve without the workers")
_w.teardown = _teardown_then_a_sample
try:
    with capture_output() as _c:
        get_ipython().run_line_magic("gpumem", "free --children")
finally:
    _w.teardown = _teardown
print("\n".join(o.data.get("text/plain", "") for o in _c.outputs))`, mustJSON(t, again)), 120*time.Second)
	if r.Status != "ok" || !strings.Contains(r.Stdout, "DataLoader worker") || !strings.Contains(r.Stdout, "ended during the frameworks' teardown") {
		t.Fatalf("%%gpumem free --children: %+v", r)
	}
	if want := "(the driver's figure for this kernel: 3.5 GiB -> 2.0 GiB)"; !strings.Contains(r.Stdout, want) {
		t.Errorf("%%gpumem free --children does not say %q:\n%s", want, r.Stdout)
	}
	for _, pid := range again {
		testenv.Poll(t, 20*time.Second, fmt.Sprintf("new worker %d ends", pid), func() bool { return !testenv.Alive(pid) })
	}
	if r := testenv.RunCell(t, k.ConnectionFile, "print(6*7)", 30*time.Second); strings.TrimSpace(r.Stdout) != "42" {
		t.Errorf("the kernel is not usable after: %+v", r)
	}
}
