// Package tests holds gpumem's end-to-end scenarios: the real gpumem binary,
// built once by TestMain, run as a subprocess against real Jupyter servers and
// ipykernel kernels that internal/testenv starts on 127.0.0.1 with temporary
// runtime dirs and tokens. The only fake is the simulated-GPU file
// (GPUMEM_FAKE_GPU). One scenario per file; this file holds the shared
// harness.
package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// gpumemBin is the binary TestMain built from ./cmd/gpumem (testenv.RunWithGpumem:
// with the race detector, or GPUMEM_TEST_BIN).
var gpumemBin string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithGpumem(m, "gpumem-e2e-", &gpumemBin))
}

// result is one finished run of the binary.
type result struct {
	Stdout, Stderr string
	Code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.Code, r.Stdout, r.Stderr)
}

// runGpumem runs the binary with env (nothing inherited) and args, and fails
// the test if it cannot start or runs past a minute.
func runGpumem(t testing.TB, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gpumemBin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{Stdout: stdout.String(), Stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("gpumem %s: still running after a minute\n%s", strings.Join(args, " "), res)
	case errors.As(err, &exit):
		res.Code = exit.ExitCode()
	case err != nil:
		t.Fatalf("gpumem %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// gpumemEnv is the environment of a gpumem run beside the Jupyter processes
// confined to dir (JUPYTER_RUNTIME_DIR=dir/runtime and so on), plus extra.
func gpumemEnv(dir string, extra ...string) []string {
	return testenv.Env(dir, extra...)
}

// cellInts runs code in the kernel behind connFile as a frontend cell and
// parses the whitespace-separated integers it prints.
func cellInts(t testing.TB, connFile, code string) []int {
	t.Helper()
	testenv.WaitKernelListening(t, connFile, 60*time.Second)
	r := testenv.RunCell(t, connFile, code, 60*time.Second)
	if r.Status != "ok" {
		t.Fatalf("cell %q in %s: %s %s: %s", code, connFile, r.Status, r.EName, r.EValue)
	}
	var out []int
	for _, f := range strings.Fields(r.Stdout) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("cell %q printed %q: not integers", code, r.Stdout)
		}
		out = append(out, n)
	}
	return out
}

// startUnrelated starts a real process that belongs to no kernel, killed in
// t.Cleanup.
func startUnrelated(t testing.TB, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// currentUser is the name gpumem should show for our processes.
func currentUser(t testing.TB) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatalf("current user: %v", err)
	}
	return u.Username
}

// lsReport is `gpumem ls --json` as sidecar/attribution/report.go
// define it; decoded here independently so the wire format is what is tested.
type lsReport struct {
	GPUs []struct {
		Index            int    `json:"index"`
		UUID             string `json:"uuid"`
		Name             string `json:"name"`
		MemoryTotalBytes uint64 `json:"memory_total_bytes"`
		MemoryUsedBytes  uint64 `json:"memory_used_bytes"`
		Simulated        bool   `json:"simulated"`
		NotebookBytes    uint64 `json:"notebook_bytes"`
		OtherBytes       uint64 `json:"other_bytes"`
		FreeBytes        uint64 `json:"free_bytes"`
	} `json:"gpus"`
	Notebooks []lsNotebook `json:"notebooks"`
	Other     []struct {
		PID     int        `json:"pid"`
		User    string     `json:"user"`
		Command string     `json:"command"`
		PerGPU  []gpuBytes `json:"per_gpu"`
	} `json:"other"`
	Warnings []string `json:"warnings"`
}

type lsNotebook struct {
	KernelID       string     `json:"kernel_id"`
	ConnectionFile string     `json:"connection_file"`
	Notebook       string     `json:"notebook"`
	PIDs           []int      `json:"pids"`
	User           string     `json:"user"`
	GPUMemoryBytes uint64     `json:"gpu_memory_bytes"`
	PerGPU         []gpuBytes `json:"per_gpu"`
	Processes      []struct {
		PID    int        `json:"pid"`
		PerGPU []gpuBytes `json:"per_gpu"`
	} `json:"processes"`
}

type gpuBytes struct {
	Index int    `json:"index"`
	Bytes uint64 `json:"bytes"`
}

// kernelJSON is one element of `gpumem kernels --json`.
type kernelJSON struct {
	KernelID       string `json:"kernel_id"`
	Notebook       string `json:"notebook"`
	PID            int    `json:"pid"`
	Language       string `json:"language"`
	Alive          bool   `json:"alive"`
	ConnectionFile string `json:"connection_file"`
	ServerURL      string `json:"server_url"`
}

// kernelKeys are exactly the keys of each `gpumem kernels --json` object.
var kernelKeys = []string{"kernel_id", "notebook", "pid", "language", "alive", "connection_file", "server_url"}

// decodeKernels parses `gpumem kernels --json`, failing the test unless every
// object has exactly kernelKeys.
func decodeKernels(t testing.TB, res result) map[string]kernelJSON {
	t.Helper()
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(res.Stdout), &raw); err != nil {
		t.Fatalf("gpumem kernels --json: not a JSON array: %v\n%s", err, res)
	}
	var rows []kernelJSON
	if err := json.Unmarshal([]byte(res.Stdout), &rows); err != nil {
		t.Fatalf("gpumem kernels --json: wrong types: %v\n%s", err, res)
	}
	byID := map[string]kernelJSON{}
	for i, obj := range raw {
		var keys []string
		for k := range obj {
			keys = append(keys, k)
		}
		if len(obj) != len(kernelKeys) {
			t.Errorf("kernel %d has keys %v, want exactly %v", i, keys, kernelKeys)
		}
		for _, k := range kernelKeys {
			if _, ok := obj[k]; !ok {
				t.Errorf("kernel %d lacks key %q (has %v)", i, k, keys)
			}
		}
		if _, dup := byID[rows[i].KernelID]; dup {
			t.Errorf("kernel %s listed twice", rows[i].KernelID)
		}
		byID[rows[i].KernelID] = rows[i]
	}
	return byID
}
