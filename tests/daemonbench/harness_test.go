package daemonbench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/protocol"
)

var binDir string // built binaries; removed by TestMain

func TestMain(m *testing.M) {
	if testenv.ShortSkipsPackage() {
		os.Exit(0)
	}
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
	return buildBinary(b, "gpumem", "./cmd/gpumem")
}

// fakeKernelBinary builds ./tests/daemonbench/fakekernel once.
func fakeKernelBinary(b *testing.B) string {
	b.Helper()
	return buildBinary(b, "fakekernel", "./tests/daemonbench/fakekernel")
}

var built = map[string]string{} // name → binary; guarded by buildMu

var buildMu sync.Mutex

// buildBinary builds pkg (testenv.GoBuild, without -race) once per run.
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
	bin, err := testenv.GoBuild(binDir, name, pkg, false)
	if err != nil {
		b.Fatal(err)
	}
	built[name] = bin
	return bin
}

// daemon is a running `gpumem serve` (testenv's harness), stopped
// gracefully in Cleanup.
type daemon struct{ *testenv.Daemon }

// startDaemon runs `gpumem serve --log-format=json --log-level=info
// args...` (the level users run; args may override it) on the runtime dir
// of dir's Jupyter environment (testenv.Env; a server's srv.Dir) with the
// simulated GPU, and waits until its API answers. The Go runtime's knobs
// pass through, for experiments on the daemon's memory (GODEBUG=gctrace=1
// prints each GC to the kept log); DAEMONBENCH_LOGDIR keeps its log.
func startDaemon(b *testing.B, dir string, gpu *testenv.FakeGPU, args ...string) *daemon {
	b.Helper()
	return startDaemonBin(b, gpumemBinary(b), dir, gpu, nil, args...)
}

// startDaemonBin is startDaemon with the binary given and env added to the
// daemon's environment.
func startDaemonBin(b *testing.B, bin, dir string, gpu *testenv.FakeGPU, env []string, args ...string) *daemon {
	b.Helper()
	env = slices.Clone(env)
	for _, k := range []string{"GOGC", "GOMEMLIMIT", "GODEBUG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	opts := testenv.DaemonOptions{Env: env, LogLevel: "info", Graceful: true, KeepLogDir: os.Getenv("DAEMONBENCH_LOGDIR")}
	return &daemon{testenv.StartDaemonWith(b, bin, dir, gpu, opts, args...)}
}

func (d *daemon) pid() int { return d.PID() }

func (d *daemon) output() string { return d.Output() }

// countLogs counts the lines from index `from` on with message msg about
// kernelID.
func (d *daemon) countLogs(from int, msg, kernelID string) int {
	n := 0
	for _, l := range d.LogsSince(from) {
		if l.Fields["message"] == msg && l.Fields["kernel_id"] == kernelID {
			n++
		}
	}
	return n
}

// waitInjected waits until the daemon logs "magics injected" for kernelID.
// On timeout it fails with what is known of that kernel: its process, its
// answer to a client of ours, the daemon's view and log of it (and the
// daemon's goroutine stacks follow, from Cleanup).
func (d *daemon) waitInjected(b *testing.B, timeout time.Duration, kernelID, connFile string) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, ok := d.FindLogSince(0, "magics injected", map[string]any{"kernel_id": kernelID}); ok {
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
	ks, err := d.Client.Kernels(ctx)
	cancel()
	fmt.Fprintf(&diag, "daemon's /api/v1/kernels (error %v):\n", err)
	for _, k := range ks {
		if k.KernelID == kernelID {
			fmt.Fprintf(&diag, "  %+v\n", k)
		}
	}
	fmt.Fprintf(&diag, "daemon's log of it:\n")
	for _, l := range d.LogsSince(0) {
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
	rep, err := d.Client.Notebooks(ctx)
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
