// Package adversarial is gpumem's regression suite against hostile or
// careless surroundings: connection files that lie, files that are FIFOs or
// devices, runtime dirs deleted under a running daemon, socket dirs others
// can write, a second daemon, and frees that cannot be answered. Each
// scenario runs the real binary against real processes and kernels, with a
// simulated GPU listing real pids. GPUMEM_TEST_BIN runs it against another
// build (an older one fails it).
//
// Every scenario calls t.Parallel: most of their time is waiting on
// deadlines, and each has its own daemon, dirs, ports, simulated GPU and
// users (a root daemon is always limited to its test's users with
// --users). A new scenario keeps to that: no environment variables of the
// test process (t.Setenv), no fixed paths, ports or user names, no state
// shared between tests unless it is locked.
package adversarial

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

var gpumemBin string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithGpumem(m, "gpumem-adversarial", &gpumemBin))
}

// jupyterDir makes a confined Jupyter environment (see testenv.Env) with
// its runtime dir.
func jupyterDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "runtime"), 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// pyProc runs a Python snippet that prints one line of space-separated
// integers (pids, ports) and then keeps running; it returns them. The
// process and its group are killed in Cleanup.
func pyProc(t *testing.T, code string) (*exec.Cmd, []int) {
	t.Helper()
	return pyProcAs(t, nil, code)
}

// pyProcAs is pyProc run as user u (nil: this process's), in u's home.
func pyProcAs(t *testing.T, u *testenv.User, code string) (*exec.Cmd, []int) {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", "-c", code)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		cmd = u.Command(nil, "/usr/bin/python3", "-c", code)
		cmd.SysProcAttr.Setpgid = true
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
	}()
	select {
	case l := <-line:
		var nums []int
		for _, f := range strings.Fields(l) {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("helper printed %q", l)
			}
			nums = append(nums, n)
		}
		return cmd, nums
	case <-time.After(30 * time.Second):
		t.Fatal("helper process printed nothing in 30 s")
	}
	return nil, nil
}

// killLater kills pids in Cleanup, those that still run: through pidfds
// taken now (testenv.Reaper), since a pid whose process exited meanwhile
// (reclaimed by the daemon under test) may be another process's by then.
func killLater(t *testing.T, pids ...int) {
	testenv.NewReaper(t, nil).Add(pids...)
}

// staysAlive fails unless pid is still alive after d: the negative half of
// a kill check, a bounded wait for something that must not happen.
func staysAlive(t *testing.T, d time.Duration, what string, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for _, pid := range pids {
			if !testenv.Alive(pid) {
				t.Fatalf("%s: pid %d was ended; it must be left alone", what, pid)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// namesPID says whether text names pid as a number of its own: pid 625
// is not in "16250", nor in a kernel id's "-6253-" (hex digits and dashes
// around it make it part of an id).
func namesPID(text string, pid int) bool {
	return regexp.MustCompile(fmt.Sprintf(`(^|[^0-9a-fA-F-])%d($|[^0-9a-fA-F-])`, pid)).MatchString(text)
}

// gpumem runs the CLI with dir's environment (deadline 60 s) and returns
// its output and exit error.
func gpumem(t *testing.T, dir string, gpu *testenv.FakeGPU, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return gpumemWith(t, dir, gpu, nil, args...)
}

// gpumemWith is gpumem with extra environment (NAME=value).
func gpumemWith(t *testing.T, dir string, gpu *testenv.FakeGPU, extra []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, gpumemBin, args...)
	env := []string{}
	if gpu != nil {
		env = append(env, "GPUMEM_FAKE_GPU="+gpu.Path)
	}
	cmd.Env = testenv.Env(dir, append(env, extra...)...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("gpumem %v did not return within 60 s (hung)\nstderr: %s", args, e.String())
	}
	return o.String(), e.String(), err
}

// kernelHolds reports whether the report lists pid under kernelID's
// notebook, and whether it lists it among the other processes.
func kernelHolds(rep attribution.Report, kernelID string, pid int) (underKernel, other bool) {
	for _, nb := range rep.Notebooks {
		for _, p := range nb.Processes {
			if p.PID == pid && nb.KernelID == kernelID {
				underKernel = true
			}
		}
	}
	for _, o := range rep.Other {
		if o.PID == pid {
			other = true
		}
	}
	return underKernel, other
}

// metricsURL is the /metrics URL of a daemon started with
// --listen=127.0.0.1:0, from its "serving metrics" log line.
func metricsURL(t *testing.T, d *testenv.Daemon) string {
	t.Helper()
	m := d.WaitLog(t, 30*time.Second, "serving metrics", nil)
	addr, _ := m["addr"].(string)
	if addr == "" {
		t.Fatalf("the daemon's \"serving metrics\" line names no addr: %v", m)
	}
	return "http://" + addr + "/metrics"
}

// scrapeMetrics GETs url (deadline 10 s) and returns the body; a status
// other than 200 fails the test.
func scrapeMetrics(t *testing.T, url string) string {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return string(body)
}

// metricValue is the value of an unlabelled series name in a /metrics body.
func metricValue(body, name string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// mkdirAs makes dir (and its parents under u's home) as u, mode 0700.
func mkdirAs(t *testing.T, u testenv.User, dir string) {
	t.Helper()
	if _, stderr, err := u.Run(nil, "mkdir", "-p", "-m", "700", dir); err != nil {
		t.Fatalf("mkdir %s as %s: %v\n%s", dir, u.Name, err, stderr)
	}
}
