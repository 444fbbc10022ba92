package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// cullSetup starts a server, a notebook whose kernel holds kernelBytes on
// the simulated GPU, and gpumem serve with culling after 2 s idle and a 2 s
// warning.
func cullSetup(t *testing.T, action string, kernelBytes uint64, extra ...string) (*testenv.Server, *notebook, *testenv.Daemon, *testenv.FakeGPU) {
	t.Helper()
	return cullSetupWith(t, action, kernelBytes, nil, extra...)
}

// cullSetupWith is cullSetup with a step run before the daemon starts.
func cullSetupWith(t *testing.T, action string, kernelBytes uint64, before func(*testenv.Server, *notebook), extra ...string) (*testenv.Server, *notebook, *testenv.Daemon, *testenv.FakeGPU) {
	t.Helper()
	testenv.Require(t, "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	nb := openNotebook(t, srv, "cull/idle.ipynb")
	if before != nil {
		before(srv, nb)
	}
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: nb.pid, UsedBytes: kernelBytes})
	args := append([]string{"--interval=200ms", "--rescan=300ms", "--cull-idle=2s", "--cull-warn=2s",
		"--cull-min-memory=1GiB", "--cull-action=" + action, "--reclaim-grace=500ms"}, extra...)
	d := startDaemon(t, srv, gpu, args...)
	return srv, nb, d, gpu
}

// serverKernels lists the kernel ids the server runs.
func serverKernels(t *testing.T, srv *testenv.Server) []string {
	t.Helper()
	var ks []struct {
		ID string `json:"id"`
	}
	srv.JSON(t, http.MethodGet, "api/kernels", nil, &ks)
	var ids []string
	for _, k := range ks {
		ids = append(ids, k.ID)
	}
	return ids
}

// An idle kernel holding GPU memory is warned, then shut down through its
// server (which no longer lists it), and its orphan is reclaimed.
func TestGPUCullShutdown(t *testing.T) {
	srv, nb, d, gpu := cullSetup(t, "shutdown", 2<<30)
	orphan := nb.startOrphanable(t)
	gpu.Set(t, testenv.FakeProc{PID: nb.pid, UsedBytes: 2 << 30}, testenv.FakeProc{PID: orphan, UsedBytes: 1 << 30})
	kid := nb.sess.Kernel.ID
	warned := d.WaitLog(t, 60*time.Second, "idle kernel holds GPU memory: warned", map[string]any{"kernel_id": kid})
	d.WaitLog(t, 30*time.Second, "idle kernel holding GPU memory shut down through its server", map[string]any{"kernel_id": kid})
	testenv.Poll(t, 30*time.Second, "the server no longer lists the kernel", func() bool {
		for _, id := range serverKernels(t, srv) {
			if id == kid {
				return false
			}
		}
		return true
	})
	d.WaitLog(t, 30*time.Second, "orphan ended", map[string]any{"pid": orphan})
	t.Logf("warned at %v", warned["time"])
}

// The user running a cell during the warning cancels it; nothing is done.
func TestGPUCullCancelledByUse(t *testing.T) {
	srv, nb, d, _ := cullSetup(t, "shutdown", 2<<30, "--cull-warn=5s")
	kid := nb.sess.Kernel.ID
	d.WaitLog(t, 60*time.Second, "idle kernel holds GPU memory: warned", map[string]any{"kernel_id": kid})
	// gpumem ls --idle (through the daemon) shows the warning's plan.
	cmd := exec.Command(gpumemBin, "ls", "--idle")
	cmd.Env = testenv.Env(srv.Dir)
	ls, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(ls), "cull/idle.ipynb") || !strings.Contains(string(ls), "shutdown in") {
		t.Errorf("gpumem ls --idle: %v\n%s", err, ls)
	}
	out := nb.front.Cell(t, "print('still here')").Text()
	if !strings.Contains(out, "still here") {
		t.Fatalf("cell output %q", out)
	}
	d.WaitLog(t, 30*time.Second, "cull cancelled", map[string]any{"kernel_id": kid})
	if _, acted := d.FindLog("idle kernel holding GPU memory shut down through its server", nil); acted {
		t.Fatal("the kernel was shut down although it was used during the warning")
	}
	if !testenv.Alive(nb.pid) {
		t.Fatal("the kernel is gone")
	}
}

// A busy kernel is never culled, and a kernel under the memory minimum
// neither: no warning while either holds for well past idle + warning.
func TestGPUCullNeverBusyOrSmall(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes uint64
		busy  bool
	}{{"busy", 2 << 30, true}, {"small", 512 << 20, false}} {
		t.Run(tc.name, func(t *testing.T) {
			var before func(*testenv.Server, *notebook)
			if tc.busy { // busy before the daemon looks, and its server knows it
				before = func(srv *testenv.Server, nb *notebook) {
					req := testenv.ExecuteRequest{Code: "import time; time.sleep(15)"}
					go func() { _, _ = nb.front.Execute(context.Background(), req) }()
					testenv.Poll(t, 10*time.Second, "the server reports the kernel busy", func() bool {
						var k struct {
							State string `json:"execution_state"`
						}
						srv.JSON(t, http.MethodGet, "api/kernels/"+nb.sess.Kernel.ID, nil, &k)
						return k.State == "busy"
					})
				}
			}
			_, nb, d, _ := cullSetupWith(t, "shutdown", tc.bytes, before)
			deadline := time.Now().Add(8 * time.Second) // idle 2 s + warning 2 s, twice over
			for time.Now().Before(deadline) {
				if _, ok := d.FindLog("idle kernel holds GPU memory: warned", nil); ok {
					t.Fatalf("a %s kernel was warned", tc.name)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !testenv.Alive(nb.pid) {
				t.Fatal("the kernel is gone")
			}
		})
	}
}

// report only logs and counts; free empties the caches; both leave the
// kernel running.
func TestGPUCullReportAndFree(t *testing.T) {
	for _, tc := range []struct{ action, log string }{
		{"report", "idle kernel holds GPU memory (culling reports only)"},
		{"free", "idle kernel's GPU caches freed"},
	} {
		t.Run(tc.action, func(t *testing.T) {
			port := testenv.FreePort(t)
			srv, nb, d, _ := cullSetup(t, tc.action, 2<<30, fmt.Sprintf("--listen=127.0.0.1:%d", port))
			kid := nb.sess.Kernel.ID
			d.WaitLog(t, 60*time.Second, tc.log, map[string]any{"kernel_id": kid})
			if !testenv.Alive(nb.pid) || !contains(serverKernels(t, srv), kid) {
				t.Fatalf("%s ended the kernel", tc.action)
			}
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			want := fmt.Sprintf(`gpumem_culled_kernels_total{action=%q} 1`, tc.action)
			if !strings.Contains(string(body), want) {
				t.Errorf("/metrics lacks %s", want)
			}
			// The notebook's figures carry its activity.
			rep := d.Report(t)
			for _, n := range rep.Notebooks {
				if n.KernelID == kid && (n.Activity == nil || n.Activity.ExecutionState == "") {
					raw, _ := json.Marshal(n)
					t.Errorf("no activity for the kernel: %s", raw)
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
