package adversarial

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// slowServers is a user's ten Jupyter servers that are not: each answers
// /api/sessions by trickling an 18 MB list that never ends. It writes a
// jpserver file for each in runtime and prints the first port.
const slowServers = `
import http.server, json, os, sys, threading, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(18 << 20))
        self.end_headers()
        chunk = b'{"id": "s", "path": "x.ipynb", "kernel": {"id": "k"}},' * 80
        try:
            self.wfile.write(b"[")
            while True:
                self.wfile.write(chunk)
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass
    def log_message(self, *a):
        pass
ports = []
for i in range(10):
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    port = s.server_address[1]
    ports.append(port)
    with open(os.path.join(%q, "jpserver-%%d.json" %% (100000 + i)), "w") as f:
        json.dump({"url": "http://127.0.0.1:%%d/" %% port, "token": "t", "pid": os.getpid(), "root_dir": "/tmp"}, f)
print(ports[0], flush=True)
while True:
    time.sleep(60)
`

// Discovery asks servers that users control. User B (a real account)
// names ten servers that trickle their session lists forever; meanwhile a
// kernel of another user holds GPU memory with a child. Sampling must go
// on every interval (gpumem_last_sample_timestamp_seconds never lags), and
// when the kernel dies its orphan is reclaimed on time.
func TestSlowServersDoNotStopSampling(t *testing.T) {
	t.Parallel()
	testenv.RequireRoot(t, "user B is a real account; the daemon runs as root with --all-users")
	b := testenv.MakeUser(t, "slow")
	mkdirAs(t, b, b.RuntimeDir())
	_, nums := pyProcAs(t, &b, fmt.Sprintf(slowServers, b.RuntimeDir()))
	dir := jupyterDir(t)
	k := testenv.StartKernel(t, dir)
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	plain, ownSession := spawnChildren(t, k)
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: k.Cmd.Process.Pid, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: plain, UsedBytes: 1 << 29}, testenv.FakeProc{PID: ownSession, UsedBytes: 1 << 28})
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--all-users", "--users="+b.Name, "--no-inject",
		"--interval=200ms", "--reclaim-grace=500ms", "--listen=127.0.0.1:0")
	url := metricsURL(t, d)
	testenv.Poll(t, 30*time.Second, "the daemon attributes both children to the kernel", func() bool {
		rep := d.Report(t)
		a, _ := kernelHolds(rep, k.ID, plain)
		c, _ := kernelHolds(rep, k.ID, ownSession)
		return a && c
	})
	d.WaitLog(t, 30*time.Second, "discovery", map[string]any{"error": fmt.Sprintf("~127.0.0.1:%d", nums[0])})

	// For 8 s, while the servers stall every scan that asks them, the
	// last sample is never more than a few intervals old.
	var worst time.Duration
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		ts, ok := metricValue(scrapeMetrics(t, url), "gpumem_last_sample_timestamp_seconds")
		if !ok {
			t.Fatal("/metrics has no gpumem_last_sample_timestamp_seconds")
		}
		worst = max(worst, time.Since(time.Unix(0, int64(ts*1e9))))
		if d.Wait(100 * time.Millisecond) {
			t.Fatalf("the daemon exited:\n%s", d.Output())
		}
	}
	t.Logf("the last sample was at most %v old (interval 200 ms)", worst.Round(time.Millisecond))
	if worst > 1500*time.Millisecond {
		t.Errorf("sampling stalled: the last sample was %v old at a 200 ms interval", worst.Round(time.Millisecond))
	}

	// The kernel dies: its orphans are reclaimed within the grace and a
	// few samples, servers stalling or not.
	if err := k.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testenv.Poll(t, 30*time.Second, "the dead kernel's orphans reclaimed", func() bool {
		return !testenv.Alive(plain) && !testenv.Alive(ownSession)
	})
	took := time.Since(start)
	// On time is the grace and a few samples at the pace the daemon kept
	// in this run: the last sample's worst age above is that pace, a
	// loaded machine's too. Waiting for a stalled scan takes seconds more.
	onTime := 500*time.Millisecond + 4*max(200*time.Millisecond, worst)
	t.Logf("orphans reclaimed %v after the kernel died (on time: within %v)", took.Round(time.Millisecond), onTime.Round(time.Millisecond))
	if took > onTime {
		t.Errorf("the reclaim took %v (interval 200 ms, grace 500 ms, samples at most %v apart): it waited for discovery",
			took.Round(time.Millisecond), worst.Round(time.Millisecond))
	}
}
