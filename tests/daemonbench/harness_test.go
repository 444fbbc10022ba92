package daemonbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
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
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/api"
)

var binDir string // built binaries; removed by TestMain

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// gpumemBinary builds ./cmd/gpumem once, on the first benchmark's demand, so
// that `go test ./...` (no -bench) builds nothing. No -race: the figures are
// those of the binary users run. DAEMONBENCH_BIN names a prebuilt binary
// instead (another commit's, for a before/after in one sitting).
func gpumemBinary(b *testing.B) string {
	b.Helper()
	if bin := os.Getenv("DAEMONBENCH_BIN"); bin != "" {
		return bin
	}
	return buildBinary(b, "gpumem", "github.com/gpumem/gpumem/cmd/gpumem")
}

// fakeKernelBinary builds ./tests/daemonbench/fakekernel once.
func fakeKernelBinary(b *testing.B) string {
	b.Helper()
	return buildBinary(b, "fakekernel", "github.com/gpumem/gpumem/tests/daemonbench/fakekernel")
}

var built = map[string]string{} // name → binary; guarded by buildMu

var buildMu sync.Mutex

func buildBinary(b *testing.B, name, pkg string) string {
	b.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := built[name]; ok {
		return bin
	}
	if binDir == "" {
		var err error
		if binDir, err = os.MkdirTemp("", "gpumem-daemonbench-"); err != nil {
			b.Fatal(err)
		}
	}
	bin := filepath.Join(binDir, name)
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		b.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	built[name] = bin
	return bin
}

// fakeGPU is the simulated-GPU file (GPUMEM_FAKE_GPU) the daemon re-reads
// at every sample: one 80 GiB GPU.
type fakeGPU struct{ path string }

func newFakeGPU(b *testing.B) *fakeGPU {
	g := &fakeGPU{path: filepath.Join(b.TempDir(), "gpus.json")}
	g.set(b, nil)
	return g
}

// set lists the processes holding memory on one GPU: pid → bytes.
func (g *fakeGPU) set(b *testing.B, held map[int]uint64) {
	b.Helper()
	g.setGPUs(b, []map[int]uint64{held})
}

// setGPUs lists the processes holding memory on each of len(held) GPUs.
func (g *fakeGPU) setGPUs(b *testing.B, held []map[int]uint64) {
	b.Helper()
	type proc struct {
		PID       int    `json:"pid"`
		UsedBytes uint64 `json:"used_bytes"`
	}
	var gpus []any
	for i, h := range held {
		procs := []proc{}
		for pid, bytes := range h {
			procs = append(procs, proc{pid, bytes})
		}
		slices.SortFunc(procs, func(x, y proc) int { return x.PID - y.PID })
		gpus = append(gpus, map[string]any{
			"name": "Simulated H200", "uuid": fmt.Sprintf("GPU-00000000-0000-0000-0000-0000%08x", i),
			"memory_total_bytes": uint64(141 << 30), "processes": procs,
		})
	}
	data, err := json.Marshal(map[string]any{"gpus": gpus})
	if err != nil {
		b.Fatal(err)
	}
	tmp := g.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, g.path); err != nil { // atomic: never a half file
		b.Fatal(err)
	}
}

// logLine is one JSON log line of the daemon and when we read it.
type logLine struct {
	At     time.Time
	Fields map[string]any
}

// daemon is a running `gpumem serve`, in its own process group.
type daemon struct {
	cmd     *exec.Cmd
	client  *api.Client
	done    chan struct{}
	started time.Time // when the process was started

	mu    sync.Mutex
	lines []logLine
	raw   strings.Builder
}

// startDaemon runs `gpumem serve --log-format=json args...` on the runtime
// dir of dir's Jupyter environment (testenv.Env; a server's srv.Dir) with
// the simulated GPU, and waits until its API answers. It is stopped
// (SIGTERM, then SIGKILL of its group) in Cleanup.
func startDaemon(b *testing.B, dir string, gpu *fakeGPU, args ...string) *daemon {
	b.Helper()
	sock := filepath.Join(dir, "runtime", api.DefaultSocketName)
	cmd := exec.Command(gpumemBinary(b), append([]string{"serve", "--log-format=json"}, args...)...)
	cmd.Env = testenv.Env(dir, "GPUMEM_FAKE_GPU="+gpu.path)
	// The Go runtime's knobs pass through, for experiments on the daemon's
	// memory (GODEBUG=gctrace=1 prints each GC to the kept log).
	for _, k := range []string{"GOGC", "GOMEMLIMIT", "GODEBUG"} {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	d := &daemon{cmd: cmd, client: api.NewClient(sock), done: make(chan struct{}), started: time.Now()}
	// The one reader of the daemon's log; it ends at EOF, when it exits.
	go func() {
		defer close(d.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			at := time.Now()
			var m map[string]any
			ok := json.Unmarshal(sc.Bytes(), &m) == nil
			d.mu.Lock()
			d.raw.WriteString(sc.Text() + "\n")
			if ok {
				d.lines = append(d.lines, logLine{at, m})
			}
			d.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	b.Cleanup(func() {
		if b.Failed() {
			// A stuck daemon: SIGQUIT makes the Go runtime print every
			// goroutine's stack to stderr, which the log below then holds.
			_ = cmd.Process.Signal(syscall.SIGQUIT)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-d.done
		}
		d.client.Close()
		if b.Failed() {
			b.Logf("daemon log:\n%s", d.output())
		}
		if dir := os.Getenv("DAEMONBENCH_LOGDIR"); dir != "" {
			name := filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "_")+".log")
			if err := os.WriteFile(name, []byte(d.output()), 0o644); err != nil {
				b.Errorf("keeping the daemon log: %v", err)
			}
		}
	})
	testenv.Poll(b, 30*time.Second, "the daemon's API", func() bool {
		if d.exited() {
			b.Fatalf("daemon exited:\n%s", d.output())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return d.client.Healthz(ctx) == nil
	})
	return d
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *daemon) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.raw.String()
}

// logCount is how many lines the daemon has logged so far.
func (d *daemon) logCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.lines)
}

// countLogs counts the lines from index `from` on with message msg about
// kernelID.
func (d *daemon) countLogs(from int, msg, kernelID string) int {
	n := 0
	for _, l := range d.logsSince(from) {
		if l.Fields["message"] == msg && l.Fields["kernel_id"] == kernelID {
			n++
		}
	}
	return n
}

// logsSince returns the lines logged from index i on.
func (d *daemon) logsSince(i int) []logLine {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.lines[i:])
}

// findLog returns the first line from index `from` on whose message is msg
// and whose fields include every key/value of want (compared as %v).
func (d *daemon) findLog(from int, msg string, want map[string]any) (logLine, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.lines[min(from, len(d.lines)):] {
		if l.Fields["message"] != msg {
			continue
		}
		ok := true
		for k, v := range want {
			if fmt.Sprint(l.Fields[k]) != fmt.Sprint(v) {
				ok = false
				break
			}
		}
		if ok {
			return l, true
		}
	}
	return logLine{}, false
}

// waitLog polls until findLog finds the line.
func (d *daemon) waitLog(b *testing.B, timeout time.Duration, from int, msg string, want map[string]any) logLine {
	b.Helper()
	var l logLine
	testenv.Poll(b, timeout, fmt.Sprintf("daemon log %q %v", msg, want), func() bool {
		var ok bool
		l, ok = d.findLog(from, msg, want)
		return ok
	})
	return l
}

// waitInjected waits until the daemon logs "magics injected" for kernelID.
// On timeout it fails with what is known of that kernel: its process, its
// answer to a client of ours, the daemon's view and log of it (and the
// daemon's goroutine stacks follow, from Cleanup).
func (d *daemon) waitInjected(b *testing.B, timeout time.Duration, kernelID, connFile string) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, ok := d.findLog(0, "magics injected", map[string]any{"kernel_id": kernelID}); ok {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var diag strings.Builder
	fmt.Fprintf(&diag, "kernel processes of %s: %v\n", connFile, testenv.KernelPIDs(connFile))
	if data, err := os.ReadFile(connFile); err != nil {
		fmt.Fprintf(&diag, "connection file: %v\n", err)
	} else {
		fmt.Fprintf(&diag, "connection file: %s\n", data)
	}
	if c, _, err := dialNewKernel(connFile, "", 10*time.Second); err != nil {
		fmt.Fprintf(&diag, "our client: %v\n", err)
	} else {
		fmt.Fprintf(&diag, "our client: the kernel answers kernel_info (session %s)\n", c.LastKernelInfo().Session)
		_ = c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	ks, err := d.client.Kernels(ctx)
	cancel()
	fmt.Fprintf(&diag, "daemon's /api/v1/kernels (error %v):\n", err)
	for _, k := range ks {
		if k.KernelID == kernelID {
			fmt.Fprintf(&diag, "  %+v\n", k)
		}
	}
	fmt.Fprintf(&diag, "daemon's log of it:\n")
	for _, l := range d.logsSince(0) {
		if l.Fields["kernel_id"] == kernelID {
			fmt.Fprintf(&diag, "  %s %v\n", l.At.Format("15:04:05.000"), l.Fields)
		}
	}
	b.Fatalf("no \"magics injected\" for kernel %s within %v\n%s", kernelID, timeout, diag.String())
}

// notebookPIDs asks the daemon which pids it attributes to each kernel.
func (d *daemon) notebookPIDs(b *testing.B) map[string][]int {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := d.client.Notebooks(ctx)
	if err != nil {
		return nil
	}
	out := map[string][]int{}
	for _, nb := range rep.Notebooks {
		if nb.GPUMemoryBytes > 0 {
			out[nb.KernelID] = nb.PIDs
		}
	}
	return out
}

// createSession writes an empty notebook at path and POSTs a session with a
// python3 kernel for it. It returns the session and when the POST returned;
// unlike testenv's CreateSession it does not wait for anything else.
func createSession(b *testing.B, srv *testenv.Server, path string) (testenv.Session, time.Time) {
	b.Helper()
	full := filepath.Join(srv.RootDir, filepath.FromSlash(path))
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		b.Fatal(err)
	}
	nb := `{"cells":[],"metadata":{"kernelspec":{"name":"python3","display_name":"Python 3","language":"python"}},"nbformat":4,"nbformat_minor":5}`
	if err := os.WriteFile(full, []byte(nb), 0o644); err != nil {
		b.Fatal(err)
	}
	var sess testenv.Session
	srv.JSON(b, http.MethodPost, "api/sessions", map[string]any{
		"path": path, "name": filepath.Base(path), "type": "notebook",
		"kernel": map[string]any{"name": "python3"},
	}, &sess)
	return sess, time.Now()
}

// kernelPID waits until exactly one live process other than not (the
// previous process of a restarted kernel) is the kernel of connFile, and
// returns it.
func kernelPID(b *testing.B, connFile string, not int) int {
	b.Helper()
	var pid int
	testenv.Poll(b, 60*time.Second, "the kernel process of "+connFile, func() bool {
		pids := slices.DeleteFunc(testenv.KernelPIDs(connFile), func(p int) bool { return p == not })
		if len(pids) == 1 {
			pid = pids[0]
		}
		return len(pids) == 1
	})
	return pid
}

// dialKernel attaches a frontend (gpumem's own Jupyter client, in this
// process: no Python start in the measured interval) to the kernel behind
// connFile, retrying while its ports are not bound yet, and returns it with
// the time the kernel first answered kernel_info.
func dialKernel(b *testing.B, connFile string) (*protocol.Client, time.Time) {
	b.Helper()
	c, ready, err := dialNewKernel(connFile, "", 2*time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c, ready
}

// dialNewKernel is dialKernel without a testing.B (for goroutines): it
// retries every 10 ms until a kernel whose session is not notSession (the
// process before a restart) answers kernel_info.
func dialNewKernel(connFile, notSession string, timeout time.Duration) (*protocol.Client, time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		c, err := protocol.Dial(ctx, connFile, protocol.Options{
			ConnectTimeout: time.Minute, HeartbeatTimeout: 10 * time.Second, Username: "daemonbench"})
		cancel()
		if err == nil {
			ready := time.Now()
			if c.LastKernelInfo().Session != notSession {
				return c, ready, nil
			}
			_ = c.Close()
			err = errors.New("still the kernel process from before the restart")
		}
		if time.Now().After(deadline) {
			return nil, time.Time{}, fmt.Errorf("attach to %s: %w", connFile, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hasMagic asks the kernel, with a silent execute and a user expression (as
// a frontend would), whether %gpumem is registered.
func hasMagic(c *protocol.Client) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Execute(ctx, "", protocol.ExecuteOptions{
		UserExpressions: map[string]string{"m": "get_ipython().find_line_magic('gpumem') is not None"}})
	if err != nil {
		return false, err
	}
	return string(r.UserExpressions["m"].Data["text/plain"]) == `"True"`, nil
}

// waitMagic polls (every 5 ms) until %gpumem is registered and returns when
// the kernel answered so.
func waitMagic(b *testing.B, c *protocol.Client, timeout time.Duration) time.Time {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := hasMagic(c)
		now := time.Now()
		if ok {
			return now
		}
		if now.After(deadline) {
			b.Fatalf("%%gpumem not registered within %v (last error: %v)", timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// percentile is the nearest-rank p-th percentile (0 < p <= 100) of xs.
func percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// report adds the p50, p90 and max of xs, in ms, as metrics named name-*.
func report(b *testing.B, name string, xs []time.Duration, withMax bool) {
	b.ReportMetric(ms(percentile(xs, 50)), name+"-p50-ms")
	b.ReportMetric(ms(percentile(xs, 90)), name+"-p90-ms")
	if withMax {
		b.ReportMetric(ms(percentile(xs, 100)), name+"-max-ms")
	}
}

func mib(bytes uint64) float64 { return float64(bytes) / (1 << 20) }
