package adversarial

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// Connection files are anyone's to write: user B (a real account) fills
// their runtime dir with 3,000 junk kernel-*.json files, then renames them
// all, under a root --all-users daemon. No process serves or names them,
// so none may be followed: the daemon's goroutines (go_goroutines) stay
// near where they were, and its CPU time over each 10 s stays small.
func TestJunkKernelFilesCostNothing(t *testing.T) {
	t.Parallel()
	testenv.RequireRoot(t, "user B is a real account; the daemon runs as root with --all-users")
	b := testenv.MakeUser(t, "junk")
	mkdirAs(t, b, b.RuntimeDir())
	gpu := testenv.NewFakeGPU(t)
	d := testenv.StartDaemon(t, gpumemBin, jupyterDir(t), gpu, "--all-users", "--users="+b.Name, "--no-inject",
		"--listen=127.0.0.1:0")
	d.WaitLog(t, 30*time.Second, "watching a user's runtime dir", map[string]any{"runtime_dir": b.RuntimeDir()})
	url := metricsURL(t, d)
	pid := d.Cmd.Process.Pid
	goroutines := func() float64 {
		v, ok := metricValue(scrapeMetrics(t, url), "go_goroutines")
		if !ok {
			t.Fatal("/metrics has no go_goroutines")
		}
		return v
	}
	base := goroutines()

	// window measures the daemon for 10 s: its CPU time, and the most
	// goroutines seen.
	window := func(what string) (cpu time.Duration, most float64) {
		t.Helper()
		start, err := testenv.ProcCPU(pid)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			most = max(most, goroutines())
			if d.Wait(500 * time.Millisecond) {
				t.Fatalf("the daemon exited %s:\n%s", what, d.Output())
			}
		}
		end, err := testenv.ProcCPU(pid)
		if err != nil {
			t.Fatal(err)
		}
		cpu = end - start
		t.Logf("%s: CPU %v in 10 s (%.0f%% of a core), goroutines %v at most (%v before)",
			what, cpu, 100*cpu.Seconds()/10, most, base)
		return cpu, most
	}
	write := fmt.Sprintf(`
import json, os, sys
d = %q
for i in range(3000):
    p = os.path.join(d, "kernel-junk-%%04d.json" %% i)
    with open(p, "w") as f:
        json.dump({"transport": "tcp", "ip": "127.0.0.1", "shell_port": 20000 + i, "iopub_port": 30000 + i,
                   "stdin_port": 40000 + i, "control_port": 50000 + i, "hb_port": 60000 + (i %% 5000),
                   "key": "k%%d" %% i, "signature_scheme": "hmac-sha256", "kernel_name": "python3"}, f)
`, b.RuntimeDir())
	if _, stderr, err := b.Run(nil, "/usr/bin/python3", "-c", write); err != nil {
		t.Fatalf("B writing junk files: %v\n%s", err, stderr)
	}
	cpu1, most1 := window("3,000 junk files")
	rename := fmt.Sprintf(`
import os
d = %q
for n in os.listdir(d):
    if n.startswith("kernel-junk-"):
        os.rename(os.path.join(d, n), os.path.join(d, n.replace("junk", "renamed")))
`, b.RuntimeDir())
	if _, stderr, err := b.Run(nil, "/usr/bin/python3", "-c", rename); err != nil {
		t.Fatalf("B renaming junk files: %v\n%s", err, stderr)
	}
	cpu2, most2 := window("the same files renamed")
	for _, w := range []struct {
		what string
		cpu  time.Duration
		most float64
	}{{"junk files", cpu1, most1}, {"renamed", cpu2, most2}} {
		if w.most > base+50 {
			t.Errorf("%s: %v goroutines (%v before): junk files are followed", w.what, w.most, base)
		}
		// A scan every 2 s reads each file once: a fraction of a core even
		// in a race-detector build.
		if w.cpu > 3*time.Second {
			t.Errorf("%s: the daemon used %v of CPU in 10 s", w.what, w.cpu)
		}
	}
	if _, found := d.FindLog("attached", nil); found {
		t.Error("the daemon attached to a junk file")
	}
}
