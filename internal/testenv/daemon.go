package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// BuildGpumem builds the gpumem binary (with the race detector) into dir
// and returns its path. GPUMEM_TEST_BIN names a prebuilt binary instead: a
// regression suite can then be run against an older build to show that it
// fails there.
func BuildGpumem(dir string) (string, error) {
	if bin := os.Getenv("GPUMEM_TEST_BIN"); bin != "" {
		return bin, nil
	}
	_, here, _, _ := runtime.Caller(0)
	bin := filepath.Join(dir, "gpumem")
	build := exec.Command("go", "build", "-race", "-o", bin, "./cmd/gpumem")
	build.Dir = filepath.Join(filepath.Dir(here), "..", "..")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building gpumem: %w", err)
	}
	return bin, nil
}

// RunWithGpumem is a TestMain's body for packages that run the binary: it
// builds gpumem (BuildGpumem) into a temporary dir named after prefix
// (mode 0755: tests may run it as other users), sets *bin, runs the tests
// and removes the dir. It returns the exit code.
func RunWithGpumem(m *testing.M, prefix string, bin *string) int {
	dir, err := os.MkdirTemp("", prefix)
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if *bin, err = BuildGpumem(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// FakeGPU is a simulated-GPU file; the daemon re-reads it every sample.
type FakeGPU struct {
	Path string
	mu   sync.Mutex
}

// FakeProc is one process of the simulated GPU; SMPercent and
// MemoryPercent play one that computes (none: it only holds memory).
type FakeProc struct {
	PID           int    `json:"pid"`
	UsedBytes     uint64 `json:"used_bytes"`
	SMPercent     uint32 `json:"sm_percent,omitempty"`
	MemoryPercent uint32 `json:"memory_percent,omitempty"`
}

// NewFakeGPU writes an empty simulated GPU in a temporary dir.
func NewFakeGPU(t testing.TB) *FakeGPU {
	f := &FakeGPU{Path: filepath.Join(t.TempDir(), "gpus.json")}
	f.Set(t)
	return f
}

// Set lists procs on one simulated 80 GiB GPU (atomically: never a half
// file).
func (f *FakeGPU) Set(t testing.TB, procs ...FakeProc) {
	t.Helper()
	f.write(t, true, procs)
}

// SetDevices lists, on each of len(devices) simulated 80 GiB GPUs, its
// processes (atomically).
func (f *FakeGPU) SetDevices(t testing.TB, devices ...[]FakeProc) {
	t.Helper()
	f.write(t, true, devices...)
}

// SetUtilizationUnknown is Set on a GPU that cannot say how much its
// processes compute (as MIG, or a driver without per-process
// utilization); procs' percentages must be 0.
func (f *FakeGPU) SetUtilizationUnknown(t testing.TB, procs ...FakeProc) {
	t.Helper()
	f.write(t, false, procs)
}

func (f *FakeGPU) write(t testing.TB, utilization bool, devices ...[]FakeProc) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	gpus := []any{}
	for i, procs := range devices {
		if procs == nil {
			procs = []FakeProc{}
		}
		gpu := map[string]any{
			"name": "Simulated H200", "uuid": fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i),
			"memory_total_bytes": uint64(80 << 30), "processes": procs,
		}
		if !utilization {
			gpu["process_utilization"] = false
		}
		gpus = append(gpus, gpu)
	}
	doc := map[string]any{"gpus": gpus}
	b, _ := json.Marshal(doc)
	tmp := f.Path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.Path); err != nil {
		t.Fatal(err)
	}
}

// Daemon is a running `gpumem serve` whose JSON log is kept.
type Daemon struct {
	Cmd    *exec.Cmd
	Socket string
	Client *api.Client
	done   chan struct{}
	mu     sync.Mutex
	logs   []map[string]any
	raw    strings.Builder
}

// StartDaemon runs `gpumem serve` on runtimeDir (dir's Jupyter environment,
// see Env) and waits (30 s) until its API answers.
func StartDaemon(t testing.TB, bin, dir string, gpu *FakeGPU, args ...string) *Daemon {
	t.Helper()
	return StartDaemonEnv(t, bin, dir, gpu, nil, args...)
}

// StartDaemonEnv is StartDaemon with env added to the daemon's environment
// (settings that have no flag, or that an older build must not reject).
func StartDaemonEnv(t testing.TB, bin, dir string, gpu *FakeGPU, env []string, args ...string) *Daemon {
	t.Helper()
	d := tryStartDaemon(t, bin, dir, gpu, env, args...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := d.Client.Healthz(ctx)
		cancel()
		if err == nil {
			return d
		}
		if d.Exited() || time.Now().After(deadline) {
			t.Fatalf("daemon did not come up: %v\n%s", err, d.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TryStartDaemon starts `gpumem serve` without waiting for it. The socket
// is --socket=PATH when given, else gpumem.sock in dir's runtime dir.
func TryStartDaemon(t testing.TB, bin, dir string, gpu *FakeGPU, args ...string) *Daemon {
	t.Helper()
	return tryStartDaemon(t, bin, dir, gpu, nil, args...)
}

func tryStartDaemon(t testing.TB, bin, dir string, gpu *FakeGPU, env []string, args ...string) *Daemon {
	t.Helper()
	sock := filepath.Join(dir, "runtime", "gpumem.sock")
	for _, a := range args {
		if strings.HasPrefix(a, "--socket=") {
			sock = strings.TrimPrefix(a, "--socket=")
		}
	}
	cmd := exec.Command(bin, append([]string{"serve", "--log-format=json", "--log-level=debug"}, args...)...)
	cmd.Env = Env(dir, append([]string{"GPUMEM_FAKE_GPU=" + gpu.Path}, env...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{Cmd: cmd, Socket: sock, done: make(chan struct{}), Client: api.NewClient(sock)}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var m map[string]any
			d.mu.Lock()
			d.raw.WriteString(line + "\n")
			if json.Unmarshal([]byte(line), &m) == nil {
				d.logs = append(d.logs, m)
			}
			d.mu.Unlock()
		}
		_ = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		d.Stop(syscall.SIGKILL)
		d.Client.Close()
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Output())
		}
	})
	return d
}

// Exited reports whether the daemon has exited.
func (d *Daemon) Exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// Wait waits up to timeout for the daemon to exit.
func (d *Daemon) Wait(timeout time.Duration) bool {
	select {
	case <-d.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Stop signals the daemon and waits for it (SIGKILL after 15 s).
func (d *Daemon) Stop(sig syscall.Signal) {
	if !d.Exited() {
		_ = d.Cmd.Process.Signal(sig)
	}
	if !d.Wait(15 * time.Second) {
		_ = d.Cmd.Process.Kill()
		<-d.done
	}
}

// Output is everything the daemon logged.
func (d *Daemon) Output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.raw.String()
}

// FindLog returns the first log entry whose message is msg and whose fields
// include every key/value of want (values compared as fmt %v; a value
// "~text" matches a field containing text).
func (d *Daemon) FindLog(msg string, want map[string]any) (map[string]any, bool) {
	found := d.Logs(msg, want)
	if len(found) == 0 {
		return nil, false
	}
	return found[0], true
}

// Logs returns every log entry FindLog would match, in order.
func (d *Daemon) Logs(msg string, want map[string]any) []map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	var found []map[string]any
	for _, m := range d.logs {
		if m["message"] == msg && logMatches(m, want) {
			found = append(found, m)
		}
	}
	return found
}

// logMatches says whether entry m has every key/value of want (see FindLog).
func logMatches(m map[string]any, want map[string]any) bool {
	for k, v := range want {
		got := fmt.Sprint(m[k])
		if s, isStr := v.(string); isStr && strings.HasPrefix(s, "~") {
			if !strings.Contains(got, s[1:]) {
				return false
			}
			continue
		}
		if got != fmt.Sprint(v) {
			return false
		}
	}
	return true
}

// WaitLog polls (deadline timeout) for a log entry as FindLog finds it.
func (d *Daemon) WaitLog(t testing.TB, timeout time.Duration, msg string, want map[string]any) map[string]any {
	t.Helper()
	var found map[string]any
	Poll(t, timeout, fmt.Sprintf("daemon log %q %v", msg, want), func() bool {
		var ok bool
		found, ok = d.FindLog(msg, want)
		return ok
	})
	return found
}

// Report fetches the daemon's current report.
func (d *Daemon) Report(t testing.TB) attribution.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := d.Client.Notebooks(ctx)
	if err != nil {
		t.Fatalf("GET /api/v1/notebooks: %v", err)
	}
	return rep
}
