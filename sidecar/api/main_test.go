package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gpumem/gpumem/internal/syncutil"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// Environment of the helper process: the test binary re-executed under
// another uid to be a real second user at the other end of the socket.
const (
	helperEnv         = "GPUMEM_API_TEST_HELPER"
	helperSocketEnv   = "GPUMEM_API_TEST_SOCKET"
	helperRequestsEnv = "GPUMEM_API_TEST_REQUESTS"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helperMain())
	}
	goleak.VerifyTestMain(m)
}

// helperMain waits for a line on stdin (the parent has registered its pid by
// then), sends each request of helperRequestsEnv ("METHOD PATH;...") and
// prints "METHOD PATH\tSTATUS" or "METHOD PATH\terror: ...".
func helperMain() int {
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, "helper: read gate:", err)
		return 2
	}
	sock := os.Getenv(helperSocketEnv)
	hc := &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
			DisableKeepAlives: true,
		},
		Timeout: 10 * time.Second,
	}
	for _, rq := range strings.Split(os.Getenv(helperRequestsEnv), ";") {
		method, path, _ := strings.Cut(rq, " ")
		req, err := http.NewRequest(method, "http://"+SocketHost+path, nil)
		if err != nil {
			fmt.Printf("%s\terror: %v\n", rq, err)
			continue
		}
		resp, err := hc.Do(req)
		if err != nil {
			fmt.Printf("%s\terror: %v\n", rq, err)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		fmt.Printf("%s\t%d\n", rq, resp.StatusCode)
	}
	return 0
}

// requireRoot skips a test that needs to switch uids, except under CI=true
// where tests run as root and a skip would hide a broken rule.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test starts a process of another uid and needs root; CI runs tests as root")
	}
	t.Skip("needs root to start a process of another uid")
}

// otherUID is the second user: nobody.
const otherUID = 65534

// otherUser prepares t's temp dir so that uid otherUID can reach a socket in
// it and run a copy of the test binary. It returns the dir and a function
// running requests as otherUID; onStart is called with the child's pid before
// the child sends anything.
func otherUser(t *testing.T) (dir string, run func(sock string, onStart func(pid int), requests ...string) map[string]string) {
	t.Helper()
	requireRoot(t)
	dir = t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "api.test")
	copyFile(t, self, bin, 0o755)

	run = func(sock string, onStart func(pid int), requests ...string) map[string]string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = []string{
			helperEnv + "=1",
			helperSocketEnv + "=" + sock,
			helperRequestsEnv + "=" + strings.Join(requests, ";"),
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: otherUID}}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		gate, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start helper as uid %d: %v", otherUID, err)
		}
		if onStart != nil {
			onStart(cmd.Process.Pid)
		}
		_, _ = io.WriteString(gate, "go\n")
		_ = gate.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper as uid %d: %v\nstdout:\n%s\nstderr:\n%s", otherUID, err, stdout.String(), stderr.String())
		}
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			rq, result, ok := strings.Cut(line, "\t")
			if !ok {
				t.Fatalf("helper printed %q", line)
			}
			got[rq] = result
		}
		return got
	}
	return dir, run
}

func copyFile(t *testing.T, from, to string, perm os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// fakeBackend is a test double of Backend.
type fakeBackend struct {
	mu        sync.Mutex
	report    attribution.Report
	reportErr error
	kernels   map[int]fakeKernel // by pid
	frees     []freeCall
	freeFunc  func(ctx context.Context, kernelID string, req FreeRequest) (json.RawMessage, error)
	fresh     map[string]attribution.Notebook
}

type fakeKernel struct {
	id    string
	owner uint32
}

type freeCall struct {
	kernelID       string
	connectionFile string
	req            FreeRequest
	peer           Peer
}

func (b *fakeBackend) Kernels(context.Context) ([]KernelStatus, error) {
	return []KernelStatus{{KernelID: "k-admin-only", Alive: true, Language: "python"}}, nil
}

// KernelNow answers from fresh, not from the report: the tests tell them apart.
func (b *fakeBackend) KernelNow(_ context.Context, k KernelRef) (attribution.Notebook, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	nb, ok := b.fresh[k.ID]
	if !ok || k.ConnectionFile != connFileOf(k.ID) {
		return attribution.Notebook{}, fmt.Errorf("kernel %s: %w", k.ID, ErrKernelNotFound)
	}
	return nb, nil
}

// connFileOf is the connection file of the test report's kernel id.
func connFileOf(id string) string { return "/rt/kernel-" + id + ".json" }

func (b *fakeBackend) Report(context.Context) (attribution.Report, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.report, b.reportErr
}

func (b *fakeBackend) KernelOfPID(_ context.Context, pid int) (string, uint32, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.kernels[pid]
	return connFileOf(k.id), k.owner, ok
}

func (b *fakeBackend) setKernel(pid int, k fakeKernel) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kernels == nil {
		b.kernels = map[int]fakeKernel{}
	}
	b.kernels[pid] = k
}

func (b *fakeBackend) Free(ctx context.Context, k KernelRef, req FreeRequest) (json.RawMessage, error) {
	kernelID := k.ID
	peer, _ := PeerFromContext(ctx)
	b.mu.Lock()
	b.frees = append(b.frees, freeCall{kernelID: kernelID, connectionFile: k.ConnectionFile, req: req, peer: peer})
	f := b.freeFunc
	known := false
	for _, nb := range b.report.Notebooks {
		known = known || nb.ConnectionFile == k.ConnectionFile
	}
	b.mu.Unlock()
	if f != nil {
		return f(ctx, kernelID, req)
	}
	if !known {
		return nil, fmt.Errorf("free kernel %s: %w", kernelID, ErrKernelNotFound)
	}
	return json.RawMessage(`{"freed_bytes":1024}`), nil
}

func (b *fakeBackend) freeCalls() []freeCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]freeCall(nil), b.frees...)
}

// testReport has two users, three kernels on two GPUs and one other
// process, finished as the daemon finishes its reports.
func testReport() attribution.Report {
	rep := attribution.Report{
		GPUs: []attribution.GPU{
			{Index: 0, UUID: "GPU-aaaa", Name: "NVIDIA H200", MemoryTotalBytes: 100 << 30, MemoryUsedBytes: 30 << 30, Simulated: true, NotebookBytes: 25 << 30, OtherBytes: 5 << 30, FreeBytes: 70 << 30},
			{Index: 1, UUID: "GPU-bbbb", Name: "NVIDIA H200", MemoryTotalBytes: 100 << 30, MemoryUsedBytes: 10 << 30, Simulated: true, NotebookBytes: 10 << 30, FreeBytes: 90 << 30},
		},
		Notebooks: []attribution.Notebook{
			{KernelID: "kernel-a", ConnectionFile: connFileOf("kernel-a"), Notebook: "/home/alice/a.ipynb", PIDs: []int{101, 102}, User: "alice", GPUMemoryBytes: 20 << 30, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 20 << 30}}},
			{KernelID: "kernel-b", ConnectionFile: connFileOf("kernel-b"), Notebook: "/home/bob/b.ipynb", PIDs: []int{201}, User: "bob", GPUMemoryBytes: 15 << 30, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 5 << 30}, {Index: 1, Bytes: 10 << 30}}},
			{KernelID: "kernel-c", ConnectionFile: connFileOf("kernel-c"), Notebook: "/home/alice/c.ipynb", PIDs: []int{301}, User: "alice"},
		},
		Other: []attribution.OtherProcess{
			{PID: 401, User: "bob", Command: "python train.py", PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 5 << 30}}},
		},
	}
	attribution.Finish(&rep, attribution.FinishInput{})
	return rep
}

type testServer struct {
	path string
	srv  *Server
	logs *syncutil.Buffer
	stop func() // shuts down and waits; also run by Cleanup
}

// startServer serves b on a socket in dir (a new temp dir when "").
func startServer(t *testing.T, dir string, mode Mode, b Backend) *testServer {
	t.Helper()
	return startServerWith(t, dir, mode, b, nil)
}

// startServerWith is startServer with a hook to adjust the Server before it serves.
func startServerWith(t *testing.T, dir string, mode Mode, b Backend, configure func(*Server)) *testServer {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, DefaultSocketName)
	ln, err := Listen(t.Context(), path, mode)
	if err != nil {
		t.Fatalf("Listen(%s, %s): %v", path, mode, err)
	}
	logs := &syncutil.Buffer{}
	srv := NewServer(b, Options{Logger: zerolog.New(logs)})
	if configure != nil {
		configure(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Serve did not return within 15s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return &testServer{path: path, srv: srv, logs: logs, stop: stop}
}

// newTestClient is a Client closed at Cleanup.
func newTestClient(t *testing.T, path string) *Client {
	t.Helper()
	c := NewClient(path)
	t.Cleanup(c.Close)
	return c
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawReply is what rawDo got back.
type rawReply struct {
	status int
	header http.Header
	body   []byte
}

func (r rawReply) errorMessage(t *testing.T) string {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal(r.body, &eb); err != nil {
		t.Fatalf("error reply %d is not JSON {\"error\":...}: %q: %v", r.status, r.body, err)
	}
	if eb.Error == "" {
		t.Fatalf("error reply %d has an empty error: %q", r.status, r.body)
	}
	return eb.Error
}

// rawDo sends one request over the socket with full control of Host and headers.
func rawDo(t *testing.T, sock, method, path, host string, header http.Header, body string) rawReply {
	t.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctxTimeout(t), method, "http://"+SocketHost+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawReply{status: resp.StatusCode, header: resp.Header, body: data}
}

func wantStatus(t *testing.T, err error, code int) {
	t.Helper()
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != code {
		t.Fatalf("got error %v, want a %d StatusError", err, code)
	}
}
