package serve

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// notebook is a session of a real server with a frontend attached.
type notebook struct {
	srv   *testenv.Server
	sess  testenv.Session
	front *testenv.Frontend
	pid   int
}

func openNotebook(t *testing.T, srv *testenv.Server, path string) *notebook {
	t.Helper()
	sess := srv.CreateSession(t, path)
	front := testenv.StartFrontend(t, &testenv.Kernel{Dir: srv.Dir, ConnectionFile: srv.ConnectionFile(sess.Kernel.ID), ID: sess.Kernel.ID})
	nb := &notebook{srv: srv, sess: sess, front: front}
	nb.pid = nb.intCell(t, "import os; print(os.getpid())")
	return nb
}

// intCell runs a cell that prints one integer.
func (nb *notebook) intCell(t *testing.T, code string) int {
	t.Helper()
	r := nb.front.Cell(t, code)
	n, err := strconv.Atoi(strings.TrimSpace(r.Text()))
	if err != nil {
		t.Fatalf("cell %q printed %q, not a number", code, r.Text())
	}
	return n
}

// waitMagic polls until %gpumem is registered in the kernel and returns how
// long that took.
func (nb *notebook) waitMagic(t *testing.T, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		r, err := nb.front.Execute(context.Background(), testenv.ExecuteRequest{
			Code: "", Silent: true,
			UserExpressions: map[string]string{"m": "get_ipython().find_line_magic('gpumem') is not None"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(r.Reply), `"True"`) {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%%gpumem not registered in %s within %v", nb.sess.Path, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startOrphanable starts, from inside the kernel, a child in a new session
// (Jupyter's process-group kill misses it) and returns its pid. It is killed
// in Cleanup if still there.
func (nb *notebook) startOrphanable(t *testing.T) int {
	t.Helper()
	pid := nb.intCell(t, "import subprocess, sys\n"+
		"_w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"+
		"print(_w.pid)")
	testenv.NewReaper(t, nil).Add(pid) // a pidfd: the daemon may reclaim it, and its number go to another
	return pid
}

// startUnrelated starts a process that belongs to no kernel.
func startUnrelated(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	return cmd
}

// waitNotebookHas polls the daemon's API until the notebook lists pid.
func waitNotebookHas(t *testing.T, d *testenv.Daemon, kernelID string, pid int) {
	t.Helper()
	testenv.Poll(t, 15*time.Second, "daemon attributes pid "+strconv.Itoa(pid)+" to kernel "+kernelID, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rep, err := d.Client.Notebooks(ctx)
		if err != nil {
			return false
		}
		for _, nb := range rep.Notebooks {
			if nb.KernelID != kernelID {
				continue
			}
			for _, p := range nb.PIDs {
				if p == pid {
					return true
				}
			}
		}
		return false
	})
}

func TestServeInjectsNewKernels(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	gpu := testenv.NewFakeGPU(t)
	d := startDaemon(t, srv, gpu)
	if fi, err := os.Stat(d.Socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v, mode %v; want 0600", d.Socket, err, fi.Mode().Perm())
	}

	nb := openNotebook(t, srv, "projects/train.ipynb")
	took := nb.waitMagic(t, 2*time.Second)
	t.Logf("%%gpumem available %v after the kernel first answered", took)

	r := nb.front.Cell(t, "%gpumem")
	if r.Status() != "ok" || !strings.Contains(r.Text(), "GPU") {
		t.Fatalf("%%gpumem: status %s, output:\n%s", r.Status(), r.Text())
	}
	if _, ok := d.FindLog("magics injected", map[string]any{"kernel_id": nb.sess.Kernel.ID}); !ok {
		t.Errorf("no 'magics injected' log for %s", nb.sess.Kernel.ID)
	}

	// gpumem kernels answers from the daemon: same rows, same keys. On
	// jupyter_server 2 the kernel's file comes before its session and its
	// ports: the daemon names the notebook at its next scan (5 s at most).
	want := map[string]any{"kernel_id": nb.sess.Kernel.ID, "notebook": srv.RootDir + "/projects/train.ipynb",
		"pid": float64(nb.pid), "language": "python", "alive": true, "connection_file": srv.ConnectionFile(nb.sess.Kernel.ID),
		"server_url": srv.URL}
	var rows []map[string]any
	var out []byte
	deadline := time.Now().Add(10 * time.Second)
	for {
		cmd := exec.Command(gpumemBin, "kernels", "--json")
		cmd.Env = testenv.Env(srv.Dir)
		var err error
		out, err = cmd.Output()
		if err != nil {
			t.Fatalf("gpumem kernels: %v", err)
		}
		if err := json.Unmarshal(out, &rows); err != nil || len(rows) != 1 {
			t.Fatalf("gpumem kernels --json = %s (%v), want one kernel", out, err)
		}
		if rows[0]["server_url"] == want["server_url"] && rows[0]["pid"] == want["pid"] || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(rows[0]) != len(want) {
		t.Errorf("keys %v, want exactly %v", rows[0], want)
	}
	for k, v := range want {
		if rows[0][k] != v {
			t.Errorf("%s = %v, want %v", k, rows[0][k], v)
		}
	}
}

// TestServeReclaimsOrphans: a kernel's child started in its own session
// survives the kernel's restart or shutdown; the daemon ends it within 5 s.
// An unrelated process holding GPU memory is never touched.
func TestServeReclaimsOrphans(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	for _, how := range []string{"restart", "shutdown"} {
		t.Run(how, func(t *testing.T) {
			srv := testenv.StartServer(t, testenv.NotebookServer())
			gpu := testenv.NewFakeGPU(t)
			d := startDaemon(t, srv, gpu)
			nb := openNotebook(t, srv, "work/"+how+".ipynb")
			nb.waitMagic(t, 10*time.Second)
			orphan := nb.startOrphanable(t)
			other := startUnrelated(t)
			gpu.Set(t, testenv.FakeProc{PID: nb.pid, UsedBytes: 600 << 20}, testenv.FakeProc{PID: orphan, UsedBytes: 3 << 30}, testenv.FakeProc{PID: other.Process.Pid, UsedBytes: 5 << 30})
			waitNotebookHas(t, d, nb.sess.Kernel.ID, orphan)

			start := time.Now()
			switch how {
			case "restart":
				srv.JSON(t, http.MethodPost, "api/kernels/"+nb.sess.Kernel.ID+"/restart", nil, nil)
			case "shutdown":
				srv.JSON(t, http.MethodDelete, "api/sessions/"+nb.sess.ID, nil, nil)
			}
			// Reclaim first watches the survivors for GPU work for the
			// grace window (--reclaim-grace, 5 s by default).
			testenv.Poll(t, 15*time.Second, "orphan "+strconv.Itoa(orphan)+" ended", func() bool { return !testenv.Alive(orphan) })
			t.Logf("orphan gone %v after the %s request", time.Since(start), how)
			// The line is logged before the signal, but read from the
			// daemon's stderr after the orphan may be seen gone.
			d.WaitLog(t, 5*time.Second, "ending orphan that holds GPU memory (SIGTERM)", map[string]any{"pid": orphan, "after": how})
			if !testenv.Alive(other.Process.Pid) {
				t.Fatalf("unrelated process %d was ended", other.Process.Pid)
			}
			if !testenv.Alive(nb.pid) && how == "restart" {
				// expected: the old kernel process is gone; the new one gets the magics
				testenv.Poll(t, 20*time.Second, "new kernel process has %gpumem", func() bool {
					r, err := nb.front.Execute(context.Background(), testenv.ExecuteRequest{Silent: true,
						UserExpressions: map[string]string{"m": "get_ipython().find_line_magic('gpumem') is not None"}, Timeout: 5 * time.Second})
					return err == nil && strings.Contains(string(r.Reply), `"True"`)
				})
			}
		})
	}
}
