package serve

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestServeMetrics scrapes the daemon's /metrics and checks the figures a
// dashboard relies on, with the labels it groups by.
func TestServeMetrics(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	gpu := testenv.NewFakeGPU(t)
	port := testenv.FreePort(t)
	d := startDaemon(t, srv, gpu, "--listen=127.0.0.1:"+strconv.Itoa(port))
	nb := openNotebook(t, srv, "m/metrics.ipynb")
	gpu.Set(t, testenv.FakeProc{PID: nb.pid, UsedBytes: 7 << 30})
	waitNotebookHas(t, d, nb.sess.Kernel.ID, nb.pid)

	var body string
	testenv.Poll(t, 10*time.Second, "metrics show the notebook", func() bool {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		// The notebook's own series, not only one of its other families
		// (those of a kernel holding nothing yet come first).
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "gpumem_notebook_gpu_memory_bytes{") && strings.Contains(line, nb.sess.Kernel.ID) {
				return true
			}
		}
		return false
	})
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	fam := families["gpumem_notebook_gpu_memory_bytes"]
	if fam == nil || len(fam.Metric) != 1 {
		t.Fatalf("gpumem_notebook_gpu_memory_bytes: %v", fam)
	}
	labels := map[string]string{}
	for _, l := range fam.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	want := map[string]string{"kernel_id": nb.sess.Kernel.ID, "notebook": srv.RootDir + "/m/metrics.ipynb", "gpu": "0", "user": "root"}
	if os.Geteuid() != 0 {
		delete(want, "user")
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, labels[k], v)
		}
	}
	if v := fam.Metric[0].GetGauge().GetValue(); v != float64(7<<30) {
		t.Errorf("notebook bytes = %v, want %v", v, 7<<30)
	}
	for _, name := range []string{"gpumem_gpu_memory_total_bytes", "gpumem_gpu_memory_used_bytes", "gpumem_attached_kernels",
		"gpumem_reclaimed_bytes_total", "gpumem_reclaimed_processes_total", "gpumem_sample_duration_seconds", "gpumem_simulated"} {
		if families[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}
	if v := families["gpumem_gpu_memory_total_bytes"].Metric[0].GetGauge().GetValue(); v != float64(80<<30) {
		t.Errorf("total bytes = %v", v)
	}
	// A page that rebinds its name to 127.0.0.1 must not read the metrics.
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+"/metrics", nil)
	req.Host = "evil.example:" + strconv.Itoa(port)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("foreign Host: %s, want 403", resp.Status)
	}
}

// TestServeSharedModePeerCredentials: in shared mode a process of another
// uid that belongs to no kernel gets 403 for the notebooks.
func TestServeSharedModePeerCredentials(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	testenv.RequireRoot(t, "needs root to run a process as a second uid")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	gpu := testenv.NewFakeGPU(t)
	// A socket where uid 65534 can reach it (test dirs are 0700 root's).
	sockDir, err := os.MkdirTemp("", "gpumem-shared")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	if err := os.Chmod(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, srv, gpu, "--socket-mode=shared", "--socket="+sockDir+"/gpumem.sock")
	if fi, err := os.Stat(d.Socket); err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("shared socket mode %v (%v), want 0666", fi.Mode().Perm(), err)
	}
	// root's notebook; another user sees none of it and cannot free it.
	nb := openNotebook(t, srv, "roots/secret.ipynb")
	gpu.Set(t, testenv.FakeProc{PID: nb.pid, UsedBytes: 1 << 30})
	waitNotebookHas(t, d, nb.sess.Kernel.ID, nb.pid)
	code := `import socket, sys
def ask(req):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    s.sendall(req)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()
print(ask(b"GET /api/v1/notebooks HTTP/1.0\r\nHost: localhost\r\n\r\n"))
print(ask(("POST /api/v1/kernels/%s/free HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n" % sys.argv[2]).encode()))`
	cmd := exec.Command(testenv.Python(), "-c", code, d.Socket, nb.sess.Kernel.ID)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as uid 65534: %v\n%s", err, out)
	}
	got := string(out)
	if !strings.HasPrefix(got, "HTTP/1.0 200") || !strings.Contains(got, `"view":"own"`) || !strings.Contains(got, "HTTP/1.0 403") {
		t.Fatalf("uid 65534 got %q, want its own (empty) view and 403 on root's kernel", got)
	}
	for _, leak := range []string{"secret.ipynb", nb.sess.Kernel.ID + `"`} {
		if strings.Contains(strings.SplitN(got, "HTTP/1.0 403", 2)[0], leak) {
			t.Errorf("uid 65534 sees root's %q:\n%s", leak, got)
		}
	}
	// The daemon's own user (root here) may read everything.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.Client.GPUs(ctx); err != nil {
		t.Fatalf("root: %v", err)
	}
}

// TestServeLifecycle: one daemon per runtime dir; SIGTERM detaches and
// leaves kernels untouched; after SIGKILL a new daemon rebuilds its view.
func TestServeLifecycle(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	gpu := testenv.NewFakeGPU(t)
	d := startDaemon(t, srv, gpu)
	nb := openNotebook(t, srv, "life.ipynb")
	nb.waitMagic(t, 10*time.Second)
	gpu.Set(t, testenv.FakeProc{PID: nb.pid, UsedBytes: 1 << 30})
	waitNotebookHas(t, d, nb.sess.Kernel.ID, nb.pid)

	second := tryStartDaemon(t, srv, gpu)
	if !second.Wait(30 * time.Second) {
		t.Fatal("a second daemon on the same runtime dir kept running")
	}
	if !strings.Contains(second.Output(), "another gpumem daemon is serving") || second.Cmd.ProcessState.ExitCode() == 0 {
		t.Fatalf("second daemon: exit %d, output:\n%s", second.Cmd.ProcessState.ExitCode(), second.Output())
	}

	count := nb.intCell(t, "print(get_ipython().execution_count)")
	d.Stop(syscall.SIGKILL)
	if _, err := os.Stat(d.Socket); err != nil {
		t.Fatalf("after SIGKILL the socket should be left stale: %v", err)
	}
	d2 := startDaemon(t, srv, gpu)
	waitNotebookHas(t, d2, nb.sess.Kernel.ID, nb.pid)

	d2.Stop(syscall.SIGTERM)
	if code := d2.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("SIGTERM: exit %d\n%s", code, d2.Output())
	}
	if _, ok := d2.FindLog("gpumem serve stopped; kernels left untouched", nil); !ok {
		t.Errorf("no clean-stop log")
	}
	if _, err := os.Stat(d2.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after a clean stop: %v", err)
	}
	if !testenv.Alive(nb.pid) {
		t.Fatal("kernel ended with the daemon")
	}
	// The kernel still works and saw none of our requests as cells.
	if c := nb.intCell(t, "print(get_ipython().execution_count)"); c != count+1 {
		t.Errorf("execution_count %d after daemon restarts, want %d", c, count+1)
	}
}
