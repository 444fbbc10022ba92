package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestLs is gpumem ls's end-to-end scenario: real kernels behind a real Notebook 6
// server; one kernel starts a child and a child in a new session
// (start_new_session=True, as pools and inference servers do); the test
// starts an unrelated process. A simulated GPU file (two GPUs) lists all of
// them with distinct byte counts. `gpumem ls --json` must put every byte on
// the right notebook or on "other", and list the kernel without GPU memory
// with 0 bytes.
func TestLs(t *testing.T) {
	t.Parallel()
	srv := testenv.StartServer(t, testenv.NotebookServer())
	reap := testenv.NewReaper(t, srv)

	paths := map[string]string{ // role → notebook path under the root
		"train": "proj/train.ipynb",
		"eval":  "proj/sub/eval.ipynb",
		"idle":  "idle.ipynb",
	}
	kernelID := map[string]string{}
	kernelPIDOf := map[string]int{}
	notebookOf := map[string]string{}
	for role, p := range paths {
		sess := srv.CreateSession(t, p)
		kernelID[role] = sess.Kernel.ID
		notebookOf[role] = filepath.Join(srv.RootDir, filepath.FromSlash(p))
	}
	for _, role := range []string{"eval", "idle"} {
		kernelPIDOf[role] = testenv.KernelPID(t, srv.ConnectionFile(kernelID[role]))
		reap.Add(kernelPIDOf[role])
	}
	// One cell, as a user would run it: the kernel's pid, a child, and a
	// child that leaves the kernel's session and process group.
	pids := cellInts(t, srv.ConnectionFile(kernelID["train"]), `
import os, subprocess, sys
_gpumem_children = [
    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']),
    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True),
]
print(os.getpid(), *[c.pid for c in _gpumem_children])`)
	if len(pids) != 3 {
		t.Fatalf("train cell printed %v, want the kernel's and two children's pids", pids)
	}
	trainPID, childPID, setsidPID := pids[0], pids[1], pids[2]
	kernelPIDOf["train"] = trainPID
	// The setsid child survives the kernel's group kill: the reaper kills
	// it by pid.
	reap.Add(trainPID, childPID, setsidPID)
	unrelated := startUnrelated(t, "/bin/sleep", "600")
	unrelatedPID := unrelated.Process.Pid

	const (
		gib          = 1 << 30
		gpu0Total    = 80 * gib
		gpu1Total    = 40 * gib
		trainOn0     = 1_000_000_001
		childOn0     = 200_000_003
		unrelatedOn0 = 600_000_013
		trainOn1     = 50_000_011
		setsidOn1    = 300_000_007
		evalOn1      = 400_000_009
	)
	fakeFile := testenv.SimulatedGPUFile(t,
		testenv.SimGPU{Name: "Simulated H100", UUID: "GPU-e2e-0", MemoryTotalBytes: gpu0Total, Processes: []testenv.FakeProc{
			{PID: trainPID, UsedBytes: trainOn0}, {PID: childPID, UsedBytes: childOn0}, {PID: unrelatedPID, UsedBytes: unrelatedOn0},
		}},
		testenv.SimGPU{Name: "Simulated A100", UUID: "GPU-e2e-1", MemoryTotalBytes: gpu1Total, Processes: []testenv.FakeProc{
			{PID: trainPID, UsedBytes: trainOn1}, {PID: setsidPID, UsedBytes: setsidOn1}, {PID: kernelPIDOf["eval"], UsedBytes: evalOn1},
		}},
	)
	env := gpumemEnv(srv.Dir, "GPUMEM_FAKE_GPU="+fakeFile)
	me := currentUser(t)

	t.Run("json", func(t *testing.T) {
		t.Parallel()
		res := runGpumem(t, env, "ls", "--json")
		if res.Code != 0 {
			t.Fatalf("gpumem ls --json: want exit 0\n%s", res)
		}
		var rep lsReport
		if err := json.Unmarshal([]byte(res.Stdout), &rep); err != nil {
			t.Fatalf("gpumem ls --json: %v\n%s", err, res)
		}

		type wantGPU struct {
			uuid, name                    string
			total, used, notebooks, other uint64
		}
		wantGPUs := []wantGPU{
			{"GPU-e2e-0", "Simulated H100", gpu0Total, trainOn0 + childOn0 + unrelatedOn0, trainOn0 + childOn0, unrelatedOn0},
			{"GPU-e2e-1", "Simulated A100", gpu1Total, trainOn1 + setsidOn1 + evalOn1, trainOn1 + setsidOn1 + evalOn1, 0},
		}
		if len(rep.GPUs) != len(wantGPUs) {
			t.Fatalf("%d gpus, want %d\n%s", len(rep.GPUs), len(wantGPUs), res.Stdout)
		}
		for i, w := range wantGPUs {
			g := rep.GPUs[i]
			if g.Index != i || g.UUID != w.uuid || g.Name != w.name || !g.Simulated {
				t.Errorf("gpu %d: index %d uuid %q name %q simulated %v, want %d %q %q true", i, g.Index, g.UUID, g.Name, g.Simulated, i, w.uuid, w.name)
			}
			if g.MemoryTotalBytes != w.total || g.MemoryUsedBytes != w.used {
				t.Errorf("gpu %d: total %d used %d, want %d %d", i, g.MemoryTotalBytes, g.MemoryUsedBytes, w.total, w.used)
			}
			if g.NotebookBytes != w.notebooks || g.OtherBytes != w.other || g.FreeBytes != w.total-w.used {
				t.Errorf("gpu %d: notebooks %d other %d free %d, want %d %d %d", i, g.NotebookBytes, g.OtherBytes, g.FreeBytes, w.notebooks, w.other, w.total-w.used)
			}
		}

		// Per process, as nvidia-smi lists them: pid → per_gpu.
		wantProcesses := map[string]map[int][]gpuBytes{
			"train": {
				trainPID:  {{0, trainOn0}, {1, trainOn1}},
				childPID:  {{0, childOn0}},
				setsidPID: {{1, setsidOn1}},
			},
			"eval": {kernelPIDOf["eval"]: {{1, evalOn1}}},
			"idle": {},
		}
		wantNotebooks := map[string]lsNotebook{
			"train": {PIDs: []int{trainPID, min(childPID, setsidPID), max(childPID, setsidPID)},
				GPUMemoryBytes: trainOn0 + childOn0 + trainOn1 + setsidOn1,
				PerGPU:         []gpuBytes{{0, trainOn0 + childOn0}, {1, trainOn1 + setsidOn1}}},
			"eval": {PIDs: []int{kernelPIDOf["eval"]}, GPUMemoryBytes: evalOn1, PerGPU: []gpuBytes{{1, evalOn1}}},
			"idle": {PIDs: []int{kernelPIDOf["idle"]}, GPUMemoryBytes: 0, PerGPU: []gpuBytes{}},
		}
		if len(rep.Notebooks) != len(wantNotebooks) {
			t.Errorf("%d notebooks, want %d\n%s", len(rep.Notebooks), len(wantNotebooks), res.Stdout)
		}
		for role, w := range wantNotebooks {
			i := slices.IndexFunc(rep.Notebooks, func(nb lsNotebook) bool { return nb.KernelID == kernelID[role] })
			if i < 0 {
				t.Errorf("%s kernel %s not in notebooks\n%s", role, kernelID[role], res.Stdout)
				continue
			}
			nb := rep.Notebooks[i]
			if nb.Notebook != notebookOf[role] {
				t.Errorf("%s: notebook %q, want %q", role, nb.Notebook, notebookOf[role])
			}
			if !slices.Equal(nb.PIDs, w.PIDs) {
				t.Errorf("%s: pids %v, want %v (kernel first, then its processes on a GPU)", role, nb.PIDs, w.PIDs)
			}
			if nb.GPUMemoryBytes != w.GPUMemoryBytes {
				t.Errorf("%s: gpu_memory_bytes %d, want %d", role, nb.GPUMemoryBytes, w.GPUMemoryBytes)
			}
			if !slices.Equal(nb.PerGPU, w.PerGPU) {
				t.Errorf("%s: per_gpu %+v, want %+v", role, nb.PerGPU, w.PerGPU)
			}
			if nb.User != me {
				t.Errorf("%s: user %q, want %q", role, nb.User, me)
			}
			gotProcesses := map[int][]gpuBytes{}
			for _, p := range nb.Processes {
				gotProcesses[p.PID] = p.PerGPU
			}
			if len(gotProcesses) != len(wantProcesses[role]) {
				t.Errorf("%s: processes %+v, want %v", role, nb.Processes, wantProcesses[role])
			}
			for pid, per := range wantProcesses[role] {
				if !slices.Equal(gotProcesses[pid], per) {
					t.Errorf("%s: process %d per_gpu %+v, want %+v", role, pid, gotProcesses[pid], per)
				}
			}
		}

		if len(rep.Other) != 1 {
			t.Fatalf("other = %+v, want only the unrelated pid %d", rep.Other, unrelatedPID)
		}
		o := rep.Other[0]
		if o.PID != unrelatedPID || o.User != me || o.Command != "/bin/sleep 600" ||
			!slices.Equal(o.PerGPU, []gpuBytes{{0, unrelatedOn0}}) {
			t.Errorf("other = %+v, want pid %d user %q command %q per_gpu [{0 %d}]", o, unrelatedPID, me, "/bin/sleep 600", unrelatedOn0)
		}
		if len(rep.Warnings) > 0 {
			t.Errorf("warnings: %q", rep.Warnings)
		}
	})

	t.Run("text", func(t *testing.T) {
		t.Parallel()
		res := runGpumem(t, env, "ls", "--wide")
		if res.Code != 0 {
			t.Fatalf("gpumem ls --wide: want exit 0\n%s", res)
		}
		for _, want := range []string{"GPU 0", "GPU 1", "(simulated)", notebookOf["train"], notebookOf["eval"], notebookOf["idle"], "/bin/sleep 600"} {
			if !strings.Contains(res.Stdout, want) {
				t.Errorf("gpumem ls output lacks %q:\n%s", want, res.Stdout)
			}
		}
		if strings.Count(res.Stdout, "(simulated)") < 2 {
			t.Errorf("want each GPU marked (simulated):\n%s", res.Stdout)
		}
		// Without --wide the same table fits 100 columns.
		res = runGpumem(t, env, "ls")
		for _, l := range strings.Split(res.Stdout, "\n") {
			if n := len([]rune(l)); n > 100 {
				t.Errorf("gpumem ls: a line of %d columns:\n%s", n, res.Stdout)
			}
		}
	})

	t.Run("watch", func(t *testing.T) {
		t.Parallel()
		out := watchLs(t, env, "ls", "--watch=200ms")
		if !strings.Contains(out, notebookOf["train"]) {
			t.Errorf("watch frames lack %s:\n%s", notebookOf["train"], out)
		}
	})

	t.Run("watch json", func(t *testing.T) {
		t.Parallel()
		out := watchLs(t, env, "ls", "--json", "--watch=200ms")
		dec := json.NewDecoder(strings.NewReader(out))
		frames := 0
		for {
			var rep lsReport
			err := dec.Decode(&rep)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("frame %d is not a report: %v\n%s", frames, err, out)
			}
			if len(rep.GPUs) != 2 || len(rep.Notebooks) != 3 {
				t.Errorf("frame %d: %d gpus %d notebooks, want 2 and 3", frames, len(rep.GPUs), len(rep.Notebooks))
			}
			frames++
		}
		if frames < 3 {
			t.Errorf("%d JSON frames, want at least 3", frames)
		}
	})
}

// watchLs runs gpumem with args (a --watch=200ms), waits until it has drawn
// at least three frames, interrupts it as Ctrl-C would, and returns what it
// printed once it has exited cleanly.
func watchLs(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(gpumemBin, args...)
	cmd.Env = env
	var mu sync.Mutex
	var stdout, stderr bytes.Buffer
	cmd.Stdout = lockedWriter{&mu, &stdout}
	cmd.Stderr = lockedWriter{&mu, &stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	output := func() (string, string) {
		mu.Lock()
		defer mu.Unlock()
		return stdout.String(), stderr.String()
	}
	frames := func() int {
		out, _ := output()
		if slices.Contains(args, "--json") {
			return strings.Count(out, "\n}\n")
		}
		return strings.Count(out, "\x1b[H\x1b[2J")
	}
	testenv.Poll(t, 30*time.Second, "three frames of gpumem "+strings.Join(args, " "), func() bool { return frames() >= 3 })
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
		done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		out, errOut := output()
		t.Fatalf("gpumem %s: still running 10s after SIGINT\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), out, errOut)
	}
	out, errOut := output()
	if err != nil {
		t.Fatalf("gpumem %s after SIGINT: %v, want exit 0\nstderr:\n%s", strings.Join(args, " "), err, errOut)
	}
	if errOut != "" {
		t.Errorf("gpumem %s: stderr %q, want none", strings.Join(args, " "), errOut)
	}
	if !slices.Contains(args, "--json") {
		last := out[strings.LastIndex(out, "\x1b[H\x1b[2J"):]
		if !strings.Contains(last, "Every 200 ms") || !strings.Contains(last, "(simulated)") {
			t.Errorf("last frame is incomplete:\n%q", last)
		}
	}
	return out
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// TestLsBadFakeGPU: a simulated-GPU file gpumem cannot use is a clear error
// naming the file and what is wrong, and a non-zero exit.
func TestLsBadFakeGPU(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		name, data, problem string
	}{
		{"truncated", `{"gpus":[{"name":"x","memory_total_bytes":`, "line 1"},
		{"typo", `{"gpus":[{"name":"x","memory_total":1}]}`, "memory_total"},
		{"no total", `{"gpus":[{"name":"x"}]}`, "memory_total_bytes"},
		{"bad pid", `{"gpus":[{"memory_total_bytes":10,"processes":[{"pid":-3,"used_bytes":1}]}]}`, "pid -3"},
		{"over total", `{"gpus":[{"memory_total_bytes":10,"processes":[{"pid":1,"used_bytes":11}]}]}`, "memory_total_bytes"},
		{"not an object", `[]`, "line 1"},
		{"empty", ``, "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".json")
			if err := os.WriteFile(file, []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"ls", "--json"}, {"ls"}} {
				res := runGpumem(t, gpumemEnv(dir, "GPUMEM_FAKE_GPU="+file), args...)
				if res.Code == 0 || res.Stdout != "" {
					t.Errorf("gpumem %s with a %s file: want a non-zero exit and no output\n%s", strings.Join(args, " "), tc.name, res)
				}
				if !strings.Contains(res.Stderr, file) || !strings.Contains(res.Stderr, tc.problem) {
					t.Errorf("gpumem %s: stderr should name %s and %q:\n%s", strings.Join(args, " "), file, tc.problem, res.Stderr)
				}
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		file := filepath.Join(dir, "no-such-file.json")
		res := runGpumem(t, gpumemEnv(dir, "GPUMEM_FAKE_GPU="+file), "ls")
		if res.Code == 0 || !strings.Contains(res.Stderr, file) || !strings.Contains(res.Stderr, syscall.ENOENT.Error()) {
			t.Errorf("gpumem ls with a missing GPUMEM_FAKE_GPU file: want a non-zero exit naming it\n%s", res)
		}
	})
}

// TestLsUsageErrors: flags gpumem ls cannot read are exit status 2.
func TestLsUsageErrors(t *testing.T) {
	t.Parallel()
	env := gpumemEnv(t.TempDir())
	for _, args := range [][]string{
		{"ls", "--watch=often"},
		{"ls", "--watch=10ms"},
		{"ls", "--json=perhaps"},
		{"ls", "--bogus"},
	} {
		res := runGpumem(t, env, args...)
		if res.Code != 2 || res.Stderr == "" || res.Stdout != "" {
			t.Errorf("gpumem %s: want exit 2 and a message on stderr only\n%s", strings.Join(args, " "), res)
		}
	}
}
