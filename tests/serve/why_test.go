package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// showMagic runs %gpumem LINE in the kernel as a cell and returns the
// data dict it displayed and its text.
func showMagic(t *testing.T, k *testenv.Kernel, line string) (map[string]any, string) {
	t.Helper()
	r := testenv.RunCell(t, k.ConnectionFile, fmt.Sprintf(`import json as _json
from IPython.utils.capture import capture_output as _cap
with _cap() as _c:
    get_ipython().run_line_magic("gpumem", %q)
print(_json.dumps([o.data.get("application/vnd.gpumem.v1+json") for o in _c.outputs][-1]))
print("\n".join(o.data.get("text/plain", "") for o in _c.outputs))`, line), 120*time.Second)
	first, rest, _ := strings.Cut(r.Stdout, "\n")
	var data map[string]any
	if r.Status != "ok" || json.Unmarshal([]byte(first), &data) != nil {
		t.Fatalf("%%gpumem %s: %+v", line, r)
	}
	return data, rest
}

func startChild(t *testing.T, k *testenv.Kernel) int {
	t.Helper()
	r := testenv.RunCell(t, k.ConnectionFile, `import subprocess, sys
_p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(_p.pid)`, 60*time.Second)
	var pid int
	if _, err := fmt.Sscan(r.Stdout, &pid); err != nil {
		t.Fatalf("child: %+v", r)
	}
	t.Cleanup(func() { _ = exec.Command("kill", "-9", fmt.Sprint(pid)).Run() })
	return pid
}

// %gpumem why with gpumem serve on two simulated GPUs: every byte the
// driver counts for the kernel and its children is in one row, and the rows
// add up to the driver's figure; the kernel's context on the GPU it does
// not compute on and a child holding only a context are flagged as stray
// contexts in gpumem ls, the API, %gpumem, %gpumem why and the API's why;
// a child that holds memory, and the kernel's own GPU, are not.
func TestServeWhyAddsUpAndFlagsStrayContexts(t *testing.T) {
	testenv.Require(t, "torch")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "runtime"), 0o700); err != nil {
		t.Fatal(err)
	}
	k := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	testenv.RunCell(t, k.ConnectionFile, "import torch", 60*time.Second)
	idle, busy := startChild(t, k), startChild(t, k)
	kpid := k.Cmd.Process.Pid
	const mib = 1 << 20
	gpu := testenv.NewFakeGPU(t)
	gpu.SetDevices(t,
		[]testenv.FakeProc{{PID: kpid, UsedBytes: 4096 * mib}, {PID: idle, UsedBytes: 518 * mib}, {PID: busy, UsedBytes: 800 * mib}},
		[]testenv.FakeProc{{PID: kpid, UsedBytes: 512 * mib}})
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms")
	d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": k.ID})
	var nb attribution.Notebook
	testenv.Poll(t, 30*time.Second, "the daemon attributes both children", func() bool {
		for _, n := range d.Report(t).Notebooks {
			if n.KernelID == k.ID && len(n.Processes) == 3 {
				nb = n
				return true
			}
		}
		return false
	})
	const total = (4096 + 518 + 800 + 512) * mib
	type flag struct{ GPU, PID int }
	var flags []flag
	for _, sc := range nb.StrayContexts {
		flags = append(flags, flag{sc.GPU, sc.PID})
	}
	if fmt.Sprint(flags) != fmt.Sprint([]flag{{0, idle}, {1, kpid}}) {
		t.Errorf("the API flags %+v, want the idle child on GPU 0 and the kernel on GPU 1: %+v", flags, nb.StrayContexts)
	}

	data, text := showMagic(t, k, "why")
	var sum float64
	byCat := map[string][]map[string]any{}
	for _, r := range data["rows"].([]any) {
		row := r.(map[string]any)
		sum += row["bytes"].(float64)
		byCat[row["category"].(string)] = append(byCat[row["category"].(string)], row)
	}
	drv, _ := data["driver"].(map[string]any)
	if drv == nil || drv["bytes"].(float64) != total || sum != total || drv["unexplained"].(float64) != 0 {
		t.Errorf("rows add up to %.0f, the driver's figure %v (want %d):\n%s", sum, drv, total, text)
	}
	if len(byCat["outside"]) != 2 || len(byCat["child"]) != 2 {
		t.Errorf("want two outside rows (a GPU each) and two children:\n%s", text)
	}
	for _, want := range []string{"stray context (≈ 518 MiB)", "stray context (≈ 512 MiB)", fmt.Sprintf("pid %d", busy)} {
		if !strings.Contains(text, want) {
			t.Errorf("%%gpumem why does not show %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "stray context (≈ 800 MiB)") || strings.Contains(text, "stray context (≈ 4096 MiB)") {
		t.Errorf("a process that uses its GPU is flagged:\n%s", text)
	}
	// The same flags in %gpumem, gpumem ls and the API's why.
	_, summary := showMagic(t, k, "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	raw, err := d.Client.Why(ctx, k.ID, api.WhyQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var why struct{ Text string }
	if err := json.Unmarshal(raw, &why); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gpumemBin, "ls")
	cmd.Env = testenv.Env(dir, "GPUMEM_FAKE_GPU="+gpu.Path)
	out, err := cmd.CombinedOutput()
	ls := string(out)
	for face, s := range map[string]string{"%gpumem": summary, "the API's why": why.Text, "gpumem ls": ls} {
		if !strings.Contains(s, "stray context (≈ 518 MiB)") || !strings.Contains(s, "stray context (≈ 512 MiB)") {
			t.Errorf("%s does not show both stray contexts (err %v):\n%s", face, err, s)
		}
		if strings.Contains(s, "stray context (≈ 800 MiB)") {
			t.Errorf("%s flags the child that holds memory:\n%s", face, s)
		}
	}
}

// A kernel that uses one GPU normally, with a worker holding memory on it,
// is flagged nowhere.
func TestServeNoStrayContextForNormalUse(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "runtime"), 0o700); err != nil {
		t.Fatal(err)
	}
	k := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	worker := startChild(t, k)
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: 530 << 20}, testenv.FakeProc{PID: worker, UsedBytes: 2 << 30})
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms")
	testenv.Poll(t, 30*time.Second, "the daemon attributes the worker", func() bool {
		for _, n := range d.Report(t).Notebooks {
			if n.KernelID == k.ID && len(n.Processes) == 2 {
				if len(n.StrayContexts) > 0 {
					t.Fatalf("normal use flagged: %+v", n.StrayContexts)
				}
				return true
			}
		}
		return false
	})
	cmd := exec.Command(gpumemBin, "ls")
	cmd.Env = testenv.Env(dir, "GPUMEM_FAKE_GPU="+gpu.Path)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "stray") {
		t.Errorf("gpumem ls: %v\n%s", err, out)
	}
}
