package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/oom"
)

const gib = 1 << 30

// oomCell raises torch's out-of-memory error as torch's allocator does.
const oomCell = `import torch
x = torch.zeros(10)
raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which 5.00 GiB is free.")`

type oomData struct {
	Kind    string     `json:"kind"`
	Event   *oom.Event `json:"event"`
	Request struct {
		RequestedBytes uint64 `json:"requested_bytes"`
		Cell           struct {
			ExecutionCount int    `json:"execution_count"`
			Line           int    `json:"line"`
			Source         string `json:"source"`
		} `json:"cell"`
	} `json:"request"`
	DaemonError string `json:"daemon_error"`
}

// socketDo sends one request to the daemon's socket as this process.
func socketDo(t *testing.T, sock, method, path string, body []byte) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+api.SocketHost+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeOOMReport: a cell raises torch's out-of-memory error; under its
// traceback the report names the simulated GPU's other holders (a notebook
// of the same user, a process of none) with their bytes, and advice that,
// followed, frees that notebook. The daemon keeps one event (API, history,
// `gpumem ls --json`, /metrics). A kernel cannot report for another, and a
// process of no kernel cannot report at all.
func TestServeOOMReport(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel", "torch")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	gpu := testenv.NewFakeGPU(t)
	port := testenv.FreePort(t)
	d := startDaemon(t, srv, gpu, "--listen=127.0.0.1:"+strconv.Itoa(port), "--interval=500ms", "--no-notebook-alerts")
	train := openNotebook(t, srv, "work/train.ipynb")
	hold := openNotebook(t, srv, "work/hold.ipynb")
	train.waitMagic(t, 20*time.Second)
	hold.waitMagic(t, 20*time.Second)
	hold.front.Cell(t, "import torch\nbig = torch.zeros(1000)")
	other := startUnrelated(t)
	gpu.Set(t, testenv.FakeProc{PID: train.pid, UsedBytes: 10 * gib}, testenv.FakeProc{PID: hold.pid, UsedBytes: 60 * gib},
		testenv.FakeProc{PID: other.Process.Pid, UsedBytes: 5 * gib})
	waitNotebookHas(t, d, train.sess.Kernel.ID, train.pid)
	waitNotebookHas(t, d, hold.sess.Kernel.ID, hold.pid)

	start := time.Now()
	r := train.front.Cell(t, oomCell)
	took := time.Since(start)
	if r.Status() != "error" {
		t.Fatalf("the cell did not fail: %s", r.Text())
	}
	// The report comes right under the traceback.
	errAt, repAt := -1, -1
	for i, o := range r.Outputs {
		if o.Type == "error" && errAt < 0 {
			errAt = i
		}
		if o.Type == "display_data" && strings.Contains(string(o.Content), "application/vnd.gpumem.v1+json") {
			repAt = i
		}
	}
	if errAt < 0 || repAt != errAt+1 {
		t.Fatalf("outputs: traceback at %d, report at %d, want the report right after:\n%s", errAt, repAt, r.Text())
	}
	var data oomData
	if !r.Data("application/vnd.gpumem.v1+json", &data) || data.Kind != "oom" {
		t.Fatalf("no report data:\n%s", r.Text())
	}
	// Shown after the errors, which a truncated log then keeps.
	defer func() {
		if t.Failed() {
			t.Logf("the cell with the report took %v:\n%s", took.Round(time.Millisecond), r.Text())
		}
	}()
	if data.Event == nil {
		t.Fatalf("no event from the daemon (%s):\n%s", data.DaemonError, r.Text())
	}
	ev := data.Event
	if data.Request.RequestedBytes != 20*gib || ev.RequestedBytes != 20*gib {
		t.Errorf("request: kernel %d, event %d, want %d", data.Request.RequestedBytes, ev.RequestedBytes, 20*gib)
	}
	if c := data.Request.Cell; c.ExecutionCount != r.ExecutionCount() || c.Line != 3 || !strings.HasPrefix(c.Source, "raise torch.cuda.OutOfMemoryError(") {
		t.Errorf("cell: %+v (execution count %d)", c, r.ExecutionCount())
	}
	if ev.GPU == nil || ev.GPU.Index != 0 || ev.KernelID != train.sess.Kernel.ID || ev.Notebook != srv.RootDir+"/work/train.ipynb" {
		t.Fatalf("event: %+v", ev)
	}
	want := []string{
		"notebook hold.ipynb " + strconv.FormatUint(60*gib, 10), // the report's display name
		"notebook this kernel " + strconv.FormatUint(10*gib, 10) + " self",
		"process /bin/sleep 600 " + strconv.FormatUint(5*gib, 10),
	}
	var got []string
	for _, h := range ev.Holders {
		name := h.Name
		if h.Kind == "process" {
			name = h.Command
		}
		s := fmt.Sprintf("%s %s %d", h.Kind, name, h.Bytes)
		if h.Self {
			s += " self"
		}
		got = append(got, s)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("holders:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !regexp.MustCompile("^hold.ipynb \\(yours(, idle [0-9]+ (ms|s))?\\) holds 60.0 GiB of GPU 0: `gpumem free hold.ipynb --all` frees it").MatchString(ev.Advice) {
		t.Errorf("advice: %s", ev.Advice)
	}
	text := r.Text()
	for _, s := range []string{"asked for 20.0 GiB on cuda:0", "GPU 0 (Simulated H200, simulated)", "hold.ipynb", "60.0 GiB",
		"pid " + strconv.Itoa(other.Process.Pid) + " (", "this kernel", "advice: hold.ipynb (yours"} {
		if !strings.Contains(text, s) {
			t.Errorf("report lacks %q", s)
		}
	}

	// The event, once, wherever the daemon shows it.
	status, body := socketDo(t, d.Socket, http.MethodGet, "/api/v1/oom", nil)
	var evs api.OOMEventsResponse
	if status != 200 || json.Unmarshal([]byte(body), &evs) != nil || len(evs.Events) != 1 || evs.Events[0].Seq != ev.Seq {
		t.Fatalf("GET /api/v1/oom: %d %s", status, body)
	}
	if !regexp.MustCompile(`^Out of memory in train.ipynb on GPU 0: 60.0 GiB held by your (idle )?notebook hold.ipynb$`).MatchString(evs.Events[0].Headline) {
		t.Errorf("headline: %s", evs.Events[0].Headline)
	}
	// One event in history's events. (Its report holds the error's alert
	// too, of kind "oom" as well, from the first sample after it.)
	status, body = socketDo(t, d.Socket, http.MethodGet, "/api/v1/history", nil)
	var hist api.HistoryResponse
	if status != 200 || json.Unmarshal([]byte(body), &hist) != nil {
		t.Fatalf("GET /api/v1/history: %d %s", status, body)
	}
	var oomEvents []uint64
	for _, e := range hist.Events {
		if e.Kind == "oom" {
			oomEvents = append(oomEvents, e.Seq)
		}
	}
	if len(oomEvents) != 1 || oomEvents[0] != ev.Seq {
		t.Errorf("history's oom events: %v, want [%d]", oomEvents, ev.Seq)
	}
	testenv.Poll(t, 10*time.Second, "ls --json counts the error", func() bool {
		cmd := exec.Command(gpumemBin, "ls", "--json")
		cmd.Env = testenv.Env(srv.Dir)
		out, err := cmd.Output()
		if err != nil {
			return false
		}
		var rep struct {
			Notebooks []struct {
				KernelID string `json:"kernel_id"`
				OOM      *struct {
					Count     int    `json:"count"`
					LastGPU   *int   `json:"last_gpu"`
					LastEvent uint64 `json:"last_event"`
				} `json:"oom"`
			} `json:"notebooks"`
		}
		if json.Unmarshal(out, &rep) != nil {
			return false
		}
		for _, nb := range rep.Notebooks {
			if nb.KernelID == train.sess.Kernel.ID {
				return nb.OOM != nil && nb.OOM.Count == 1 && nb.OOM.LastGPU != nil && *nb.OOM.LastGPU == 0 && nb.OOM.LastEvent == ev.Seq
			}
		}
		return false
	})
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantMetric := fmt.Sprintf(`gpumem_oom_total{gpu="0",notebook=%q,user="root"} 1`, srv.RootDir+"/work/train.ipynb")
	if !strings.Contains(string(mb), wantMetric) {
		t.Errorf("/metrics lacks %s:\n%s", wantMetric, grepLines(string(mb), "gpumem_oom"))
	}

	// A kernel speaks only for itself: whatever it sends, hold's report is
	// hold's; the test process, in no kernel, may not report.
	forge := fmt.Sprintf(`import json, socket, http.client
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(%q)
c = C("localhost")
c.request("POST", "/api/v1/oom", body=json.dumps({"framework": "torch", "kernel_id": %q, "notebook": "/forged.ipynb", "requested_bytes": 1}), headers={"Content-Type": "application/json"})
r = c.getresponse(); print(r.status, json.loads(r.read())["kernel_id"])`, d.Socket, train.sess.Kernel.ID)
	if out := strings.TrimSpace(hold.front.Cell(t, forge).Text()); out != "200 "+hold.sess.Kernel.ID {
		t.Errorf("a report from hold's kernel naming train's: %q, want it recorded as hold's", out)
	}
	status, body = socketDo(t, d.Socket, http.MethodPost, "/api/v1/oom", []byte(`{"framework":"torch"}`))
	if status != http.StatusForbidden || !strings.Contains(body, "is not a process of a kernel the daemon follows") {
		t.Errorf("a report from no kernel: %d %s", status, body)
	}
	_, body = socketDo(t, d.Socket, http.MethodGet, "/api/v1/oom", nil)
	evs = api.OOMEventsResponse{}
	if json.Unmarshal([]byte(body), &evs) != nil || len(evs.Events) != 2 || evs.Events[0].KernelID != train.sess.Kernel.ID ||
		evs.Events[1].KernelID != hold.sess.Kernel.ID || strings.Contains(body, "forged") {
		t.Errorf("events after the forgeries: %s", body)
	}

	// The advice's command runs as written and reaches hold.ipynb's kernel
	// (that it frees GPU memory needs a GPU: scripts/gpuhost/oom_check.py).
	cmd := exec.Command(gpumemBin, "free", "hold.ipynb", "--all")
	cmd.Env = testenv.Env(srv.Dir)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "hold.ipynb)\nthe kernel's report, as the kernel wrote it:\n  kernel| gpumem free\n") {
		t.Fatalf("gpumem free hold.ipynb --all: %v\n%s", err, out)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
