// Package adversarial is gpumem's regression suite against hostile or
// careless surroundings: connection files that lie, files that are FIFOs or
// devices, runtime dirs deleted under a running daemon, socket dirs others
// can write, a second daemon, and frees that cannot be answered. Each
// scenario runs the real binary against real processes and kernels, with a
// simulated GPU listing real pids. GPUMEM_TEST_BIN runs it against another
// build (an older one fails it).
package adversarial

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
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
	cmd := exec.Command("/usr/bin/python3", "-c", code)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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

// gpumem runs the CLI with dir's environment (deadline 60 s) and returns
// its output and exit error.
func gpumem(t *testing.T, dir string, gpu *testenv.FakeGPU, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, gpumemBin, args...)
	env := []string{}
	if gpu != nil {
		env = append(env, "GPUMEM_FAKE_GPU="+gpu.Path)
	}
	cmd.Env = testenv.Env(dir, env...)
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
