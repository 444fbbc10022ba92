package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
)

// TestServeOOMSharedMode: a root daemon with a shared socket serves two real
// users' kernels. When alice's cell runs out of memory, her report shows
// bob's notebook as bob's and its bytes only: never its path, kernel id or
// pid, in the report, its data or the event; her own notebook keeps its
// path. bob sees none of alice's events. Per-notebook metrics off, the
// counter is by user and GPU only.
func TestServeOOMSharedMode(t *testing.T) {
	testenv.Require(t, "ipykernel", "torch")
	testenv.RequireRoot(t, "a root daemon serving two real users")
	alice, bob := testenv.MakeUser(t, "alice"), testenv.MakeUser(t, "bob")
	sockDir, err := os.MkdirTemp("", "gpumem-oom-shared")
	if err == nil {
		err = os.Chmod(sockDir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	aliceNB := filepath.Join(alice.Home, "work", "train.ipynb")
	bobNB := filepath.Join(bob.Home, "secret-bob.ipynb")
	ka := alice.StartKernel(t, filepath.Join(alice.RuntimeDir(), "kernel-"+testenv.NewKernelID()+".json"), "JPY_SESSION_NAME="+aliceNB)
	kb := bob.StartKernel(t, filepath.Join(bob.RuntimeDir(), "kernel-"+testenv.NewKernelID()+".json"), "JPY_SESSION_NAME="+bobNB)
	gpu := testenv.NewFakeGPU(t)
	if err := os.Chmod(filepath.Dir(gpu.Path), 0o755); err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePort(t)
	d := testenv.StartDaemon(t, gpumemBin, t.TempDir(), gpu, "--all-users", "--users="+alice.Name, "--users="+bob.Name,
		"--socket="+filepath.Join(sockDir, "gpumem.sock"), "--socket-mode=shared", "--interval=500ms", "--no-notebook-alerts",
		"--listen=127.0.0.1:"+strconv.Itoa(port), "--metrics-notebook-label=false")
	d.WaitLog(t, 20*time.Second, "magics injected", map[string]any{"kernel_id": ka.ID})
	d.WaitLog(t, 20*time.Second, "magics injected", map[string]any{"kernel_id": kb.ID})
	pa, pb := testenv.KernelPID(t, ka.ConnectionFile), testenv.KernelPID(t, kb.ConnectionFile)
	gpu.Set(t, testenv.FakeProc{PID: pa, UsedBytes: 10 * gib}, testenv.FakeProc{PID: pb, UsedBytes: 60 * gib})
	waitNotebookHas(t, d, ka.ID, pa)
	waitNotebookHas(t, d, kb.ID, pb)

	fa := testenv.StartFrontend(t, ka)
	r := fa.Cell(t, oomCell)
	var data oomData
	if !r.Data("application/vnd.gpumem.v1+json", &data) || data.Event == nil {
		t.Fatalf("no report with an event in alice's notebook (%s):\n%s", data.DaemonError, r.Text())
	}
	text := r.Text()
	t.Logf("alice's report:\n%s", text)
	raw, _ := json.Marshal(data)
	pidTok := func(pid int) string { return fmt.Sprintf("[^0-9]%d[^0-9]", pid) }
	for what, out := range map[string]string{"text": text, "data": string(raw)} {
		for _, leak := range []string{bobNB, "secret-bob", kb.ID} {
			if strings.Contains(out, leak) {
				t.Errorf("alice's report %s shows bob's %q", what, leak)
			}
		}
		if regexp.MustCompile(pidTok(pb)).MatchString(" " + out + " ") {
			t.Errorf("alice's report %s shows bob's pid %d", what, pb)
		}
	}
	var bobRow, selfRow bool
	for _, h := range data.Event.Holders {
		switch {
		case h.User == bob.Name:
			bobRow = h.Kind == "user" && h.Name == "user "+bob.Name && h.Bytes == 60*gib && h.KernelID == "" && h.ConnectionFile == "" &&
				len(h.PIDs) == 0 && h.PID == 0
		case h.Self:
			selfRow = h.ConnectionFile == ka.ConnectionFile && h.Name == "this kernel" && h.Bytes == 10*gib
		}
	}
	if !bobRow || !selfRow {
		t.Errorf("holders: %+v", data.Event.Holders)
	}
	if !strings.Contains(text, "user "+bob.Name) || !strings.Contains(text, "60.0 GiB") ||
		!strings.Contains(text, "other users are shown as one holder each, their total") {
		t.Errorf("alice's report does not name bob's notebook by user and bytes:\n%s", text)
	}
	wantAdvice := "user " + bob.Name + "'s notebook"
	if !strings.HasPrefix(data.Event.Advice, wantAdvice) || !strings.Contains(data.Event.Advice, "holds 60.0 GiB of GPU 0: ask "+bob.Name) {
		t.Errorf("advice: %s", data.Event.Advice)
	}
	if data.Event.Headline != "Out of memory in train.ipynb on GPU 0: 60.0 GiB held by user "+bob.Name+"'s notebook" &&
		data.Event.Headline != "Out of memory in train.ipynb on GPU 0: 60.0 GiB held by user "+bob.Name+"'s idle notebook" {
		t.Errorf("headline: %s", data.Event.Headline)
	}

	// bob, from his kernel, sees no event of alice's, in the events or the
	// history; root sees the event whole.
	ask := fmt.Sprintf(`import socket
def get(p):
    s = socket.socket(socket.AF_UNIX); s.connect(%q)
    s.sendall(("GET %%s HTTP/1.0\r\nHost: localhost\r\n\r\n" %% p).encode())
    b = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        b += c
    return b.decode()
print(get("/api/v1/oom")); print(get("/api/v1/history"))`, d.Socket)
	fb := testenv.StartFrontend(t, kb)
	out := fb.Cell(t, ask).Text()
	if !strings.Contains(out, `{"events":[]}`) || strings.Contains(out, `"kind":"oom"`) || strings.Contains(out, "train.ipynb") {
		t.Errorf("bob sees alice's out-of-memory error:\n%s", out)
	}
	status, body := socketDo(t, d.Socket, http.MethodGet, "/api/v1/oom", nil)
	var evs api.OOMEventsResponse
	if status != 200 || json.Unmarshal([]byte(body), &evs) != nil || len(evs.Events) != 1 || !strings.Contains(body, `"name":"secret-bob.ipynb"`) {
		t.Errorf("root's view of the events: %d %s", status, body)
	}

	// Snapshots: a kernel hands over only its user's own files, and only
	// its user reads them back.
	hand := fmt.Sprintf(`import json, socket, http.client, os, pickle, tempfile
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(%q)
def post(p):
    c = C("localhost")
    c.request("POST", "/api/v1/snapshots", body=json.dumps({"path": p, "reason": "manual"}), headers={"Content-Type": "application/json"})
    r = c.getresponse(); return r.status, r.read().decode()
own = os.path.join(os.path.realpath(tempfile.mkdtemp()), "s.pickle")
pickle.dump({"segments": [], "device_traces": [[]]}, open(own, "wb"))
for p in (%q, own):
    print(*post(p))`, d.Socket, gpu.Path)
	out = fa.Cell(t, hand).Text()
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "400 ") || !strings.Contains(lines[0], "is not a regular file of yours") ||
		strings.Contains(lines[0], "uid 0") || !strings.HasPrefix(lines[1], "202 ") {
		t.Fatalf("alice hands over root's file, then her own:\n%s", out)
	}
	var info api.SnapshotInfo
	if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[1], "202 ")), &info); err != nil {
		t.Fatal(err)
	}
	status, body = socketDo(t, d.Socket, http.MethodGet, "/api/v1/kernels/"+ka.ID+"/snapshots/"+info.ID+"/raw", nil)
	if status != 200 || !strings.HasPrefix(body, "\x80") {
		t.Errorf("root downloads alice's snapshot: %d", status)
	}
	bobGet := fmt.Sprintf(`import socket
s = socket.socket(socket.AF_UNIX); s.connect(%q)
s.sendall(b"GET /api/v1/kernels/%s/snapshots/%s/raw HTTP/1.0\r\nHost: localhost\r\n\r\n")
print(s.recv(200).decode(errors="replace").splitlines()[0])`, d.Socket, ka.ID, info.ID)
	if out := fb.Cell(t, bobGet).Text(); !strings.Contains(out, " 403 ") {
		t.Errorf("bob reads alice's snapshot: %s", out)
	}

	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf(`gpumem_oom_total{gpu="0",user=%q} 1`, alice.Name); !strings.Contains(string(mb), want) {
		t.Errorf("/metrics lacks %s:\n%s", want, grepLines(string(mb), "gpumem_oom"))
	}
	if strings.Contains(grepLines(string(mb), "gpumem_oom"), "notebook=") {
		t.Errorf("--metrics-notebook-label=false, yet: %s", grepLines(string(mb), "gpumem_oom"))
	}
}
