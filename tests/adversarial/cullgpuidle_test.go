package adversarial

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// The GPU-idle rule against a keep-alive, on real kernels: two notebooks
// under one real server each hold 2 GiB of the simulated GPU and run a cell
// every 300 ms, so their server's last_activity is always now (what a
// keep-alive extension does). keepalive.ipynb's processes do no GPU work:
// it is warned in the GPU-idle rule's words while its cells go on, its
// caches are freed first, it is warned again and then shut down through its
// server. train.ipynb computes (90 % SM): never warned, never touched. The
// idle rule alone would cull neither: both are used all the time.
func TestCullGPUIdleBeatsAKeepAlive(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel", "jupyter_client")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	reap := testenv.NewReaper(t, srv)
	type notebook struct {
		id    string
		pid   int
		front *testenv.Frontend
		mu    sync.Mutex
		cells []time.Time // when each keep-alive cell was answered ok
		fails []string
	}
	start := func(path string) *notebook {
		sess := srv.CreateSession(t, path)
		n := &notebook{id: sess.Kernel.ID}
		conn := srv.ConnectionFile(n.id)
		n.front = testenv.StartFrontend(t, &testenv.Kernel{Dir: srv.Dir, ConnectionFile: conn, ID: n.id})
		out := n.front.Cell(t, "import os; print(os.getpid())").Text()
		pid, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("%s's kernel pid: %q", path, out)
		}
		n.pid = pid
		reap.Add(pid)
		return n
	}
	idle, train := start("cull/keepalive.ipynb"), start("cull/train.ipynb")
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: idle.pid, UsedBytes: 2 << 30}, testenv.FakeProc{PID: train.pid, UsedBytes: 2 << 30, SMPercent: 90})
	d := testenv.StartDaemon(t, gpumemBin, srv.Dir, gpu, "--interval=200ms", "--rescan=300ms", "--compute-window=2s",
		"--cull-gpu-idle=2s", "--cull-warn=1s", "--cull-min-memory=1GiB", "--cull-action=shutdown")
	for _, n := range []*notebook{idle, train} {
		d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": n.id})
	}

	// The keep-alives: a cell every 300 ms on each kernel until the test
	// ends (or, for the culled one, its kernel is gone).
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	for _, n := range []*notebook{idle, train} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(300 * time.Millisecond)
			defer tick.Stop()
			for {
				r, err := n.front.Execute(ctx, testenv.ExecuteRequest{Code: "pass", StoreHistory: true, Timeout: 10 * time.Second})
				n.mu.Lock()
				switch {
				case err == nil && r.Status() == "ok":
					n.cells = append(n.cells, time.Now())
				case ctx.Err() == nil:
					n.fails = append(n.fails, time.Now().Format("15:04:05.000")+": "+r.Status()+" "+errText(err))
				}
				n.mu.Unlock()
				if err != nil {
					return // the kernel is gone (culled), or the test ends
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}

	first := d.WaitLog(t, 60*time.Second, "idle kernel holds GPU memory: warned",
		map[string]any{"kernel_id": idle.id, "gpu_idle_rule": true, "action": "free"})
	d.WaitLog(t, 30*time.Second, "idle kernel's GPU caches freed", map[string]any{"kernel_id": idle.id, "gpu_idle_rule": true})
	d.WaitLog(t, 30*time.Second, "idle kernel holds GPU memory: warned",
		map[string]any{"kernel_id": idle.id, "gpu_idle_rule": true, "action": "shutdown"})
	d.WaitLog(t, 30*time.Second, "idle kernel holding GPU memory shut down through its server", map[string]any{"kernel_id": idle.id})
	testenv.Poll(t, 30*time.Second, "the culled kernel's process to exit", func() bool { return !testenv.Alive(idle.pid) })

	// The keep-alive was running all along: cells answered between the
	// first warning and the shutdown.
	warnedAt := logTime(t, first)
	idle.mu.Lock()
	during := 0
	for _, at := range idle.cells {
		if at.After(warnedAt) {
			during++
		}
	}
	idle.mu.Unlock()
	if during == 0 {
		t.Errorf("no keep-alive cell ran on keepalive.ipynb after its warning: the test shows nothing about keep-alives")
	}
	// The training notebook: never warned, still served, every cell fine.
	if w := d.Logs("idle kernel holds GPU memory: warned", map[string]any{"kernel_id": train.id}); len(w) != 0 {
		t.Errorf("train.ipynb computes and was warned: %v", w)
	}
	if !testenv.Alive(train.pid) {
		t.Error("train.ipynb's kernel is gone")
	}
	train.mu.Lock()
	defer train.mu.Unlock()
	if len(train.fails) > 0 || len(train.cells) < 3 {
		t.Errorf("train.ipynb's keep-alive: %d cells ok, failures %v", len(train.cells), train.fails)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// logTime is when the daemon logged line (its "time" field).
func logTime(t *testing.T, line map[string]any) time.Time {
	t.Helper()
	s, _ := line["time"].(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("log line without a time: %v", line)
	}
	return at
}
