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
	"slices"
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
	return GoBuild(dir, "gpumem", "./cmd/gpumem", true)
}

// GoBuild builds the package pkg of this repository (a path relative to
// its root, as ./cmd/gpumem) into dir/name, with the race detector when
// race is set (benchmarks measure the binary users run: without), and
// returns the binary's path.
func GoBuild(dir, name, pkg string, race bool) (string, error) {
	_, here, _, _ := runtime.Caller(0)
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin, pkg}
	if race {
		args = []string{"build", "-race", "-o", bin, pkg}
	}
	build := exec.Command("go", args...)
	build.Dir = filepath.Join(filepath.Dir(here), "..", "..")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	return bin, nil
}

// RunWithGpumem is a TestMain's body for packages that run the binary: it
// builds gpumem (BuildGpumem) into a temporary dir named after prefix
// (mode 0755: tests may run it as other users), sets *bin, runs the tests
// and removes the dir. It returns the exit code; under -short it builds and
// runs nothing (ShortSkipsPackage).
func RunWithGpumem(m *testing.M, prefix string, bin *string) int {
	if ShortSkipsPackage() {
		return 0
	}
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
	gpus := make([]SimGPU, 0, len(devices))
	for i, procs := range devices {
		g := SimH200(i, 80<<30, procs...)
		g.UtilizationUnknown = !utilization
		gpus = append(gpus, g)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	WriteSimulatedGPUs(t, f.Path, gpus...)
}

// SetGPUs lists, on each of len(held) simulated H200s (141 GiB), the
// processes holding memory there: pid → bytes (atomically, as Set).
func (f *FakeGPU) SetGPUs(t testing.TB, held []map[int]uint64) {
	t.Helper()
	gpus := make([]SimGPU, 0, len(held))
	for i, h := range held {
		procs := make([]FakeProc, 0, len(h))
		for pid, bytes := range h {
			procs = append(procs, FakeProc{PID: pid, UsedBytes: bytes})
		}
		slices.SortFunc(procs, func(x, y FakeProc) int { return x.PID - y.PID })
		gpus = append(gpus, SimH200(i, 141<<30, procs...))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	WriteSimulatedGPUs(t, f.Path, gpus...)
}

// SetSimulated writes gpus as given (atomically, as Set).
func (f *FakeGPU) SetSimulated(t testing.TB, gpus ...SimGPU) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	WriteSimulatedGPUs(t, f.Path, gpus...)
}

// Daemon is a running `gpumem serve` whose JSON log is kept.
type Daemon struct {
	Cmd    *exec.Cmd
	Socket string
	Client *api.Client
	// Started is when the process was started.
	Started time.Time
	done    chan struct{}
	mu      sync.Mutex
	logs    []LogLine
	raw     strings.Builder
}

// LogLine is one JSON line of the daemon's log and when it was read
// (zerolog's own timestamps have whole seconds only).
type LogLine struct {
	At     time.Time
	Fields map[string]any
}

// DaemonOptions are StartDaemonWith's settings; the zero value is
// StartDaemon's.
type DaemonOptions struct {
	// Env is added to the daemon's environment (settings that have no
	// flag, or that an older build must not reject).
	Env []string
	// LogLevel is --log-level ("" is debug: tests read the attach
	// retries; benchmarks measure at info, the default users run).
	LogLevel string
	// Graceful stops the daemon in Cleanup with SIGTERM (SIGQUIT first
	// when the test failed: the Go runtime then prints every goroutine's
	// stack into the log), and kills its process group only if it has not
	// exited 10 s later. The default is SIGKILL at once.
	Graceful bool
	// KeepLogDir, when set, receives the daemon's log as <test name>.log
	// in Cleanup.
	KeepLogDir string
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
	return StartDaemonWith(t, bin, dir, gpu, DaemonOptions{Env: env}, args...)
}

// StartDaemonWith is StartDaemon with options.
func StartDaemonWith(t testing.TB, bin, dir string, gpu *FakeGPU, opts DaemonOptions, args ...string) *Daemon {
	t.Helper()
	d := tryStartDaemon(t, bin, dir, gpu, opts, args...)
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
	return tryStartDaemon(t, bin, dir, gpu, DaemonOptions{}, args...)
}

func tryStartDaemon(t testing.TB, bin, dir string, gpu *FakeGPU, opts DaemonOptions, args ...string) *Daemon {
	t.Helper()
	sock := filepath.Join(dir, "runtime", "gpumem.sock")
	for _, a := range args {
		if strings.HasPrefix(a, "--socket=") {
			sock = strings.TrimPrefix(a, "--socket=")
		}
	}
	level := opts.LogLevel
	if level == "" {
		level = "debug"
	}
	cmd := exec.Command(bin, append([]string{"serve", "--log-format=json", "--log-level=" + level}, args...)...)
	cmd.Env = Env(dir, append([]string{"GPUMEM_FAKE_GPU=" + gpu.Path}, opts.Env...)...)
	// A graceful stop may have to end what the daemon leaves: its group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: opts.Graceful}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{Cmd: cmd, Socket: sock, done: make(chan struct{}), Client: api.NewClient(sock), Started: time.Now()}
	start, _ := procStart(cmd.Process.Pid) // not reaped before Wait, below
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			at := time.Now()
			line := sc.Text()
			var m map[string]any
			d.mu.Lock()
			d.raw.WriteString(line + "\n")
			if json.Unmarshal([]byte(line), &m) == nil {
				d.logs = append(d.logs, LogLine{at, m})
			}
			d.mu.Unlock()
		}
		_ = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		if opts.Graceful {
			if t.Failed() && !d.Exited() {
				_ = d.Cmd.Process.Signal(syscall.SIGQUIT)
			}
			if !d.Exited() {
				_ = d.Cmd.Process.Signal(syscall.SIGTERM)
			}
			if !d.Wait(10 * time.Second) {
				killGroup(cmd.Process.Pid, start)
				d.Wait(10 * time.Second)
			}
		}
		d.Stop(syscall.SIGKILL)
		d.Client.Close()
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Output())
		}
		if opts.KeepLogDir != "" {
			name := filepath.Join(opts.KeepLogDir, strings.ReplaceAll(t.Name(), "/", "_")+".log")
			if err := os.WriteFile(name, []byte(d.Output()), 0o644); err != nil {
				t.Errorf("keeping the daemon log: %v", err)
			}
		}
	})
	return d
}

// PID is the daemon's process id.
func (d *Daemon) PID() int { return d.Cmd.Process.Pid }

// LogCount is how many lines the daemon has logged so far.
func (d *Daemon) LogCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.logs)
}

// LogsSince returns the lines logged from index i on.
func (d *Daemon) LogsSince(i int) []LogLine {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.logs[min(i, len(d.logs)):])
}

// FindLogSince is FindLog among the lines logged from index from on, with
// the time each was read.
func (d *Daemon) FindLogSince(from int, msg string, want map[string]any) (LogLine, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.logs[min(from, len(d.logs)):] {
		if l.Fields["message"] == msg && logMatches(l.Fields, want) {
			return l, true
		}
	}
	return LogLine{}, false
}

// WaitLogSince polls (deadline timeout) for a line as FindLogSince finds it.
func (d *Daemon) WaitLogSince(t testing.TB, timeout time.Duration, from int, msg string, want map[string]any) LogLine {
	t.Helper()
	var found LogLine
	Poll(t, timeout, fmt.Sprintf("daemon log %q %v", msg, want), func() bool {
		var ok bool
		found, ok = d.FindLogSince(from, msg, want)
		return ok
	})
	return found
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
	for _, l := range d.logs {
		if l.Fields["message"] == msg && logMatches(l.Fields, want) {
			found = append(found, l.Fields)
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
