package testenv

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

//go:embed frontend.py
var notebookFrontendPy string

// Frontend is a Jupyter frontend (jupyter_client, in Python) attached to a
// kernel, as a notebook is: it executes cells with store_history and
// collects their outputs. Tests use it to act as the user; each Frontend is
// its own client (own shell DEALER), so two of them queue on the kernel as
// two browser tabs would.
type Frontend struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte
	done   chan struct{}
	stderr *strings.Builder
	errMu  *sync.Mutex

	mu     sync.Mutex // one request at a time
	broken error
	start  uint64 // the process's start time, which stop checks before signalling its group
}

// FrontendOutput is one iopub output of a request: type is stream,
// display_data, execute_result, error or update_display_data; content is
// the message's content.
type FrontendOutput struct {
	Type    string          `json:"type"`
	Content json.RawMessage `json:"content"`
}

// FrontendReply is a request's shell reply content and its outputs.
type FrontendReply struct {
	Reply   json.RawMessage  `json:"reply"`
	Outputs []FrontendOutput `json:"outputs"`
}

// ExecuteRequest is one execute_request.
type ExecuteRequest struct {
	Code            string
	Silent          bool
	StoreHistory    bool
	UserExpressions map[string]string
	Timeout         time.Duration // default 60s
	// KeepQueue sends stop_on_error=false: a cell expected to raise does
	// not make the kernel abort the requests that follow it (ipykernel 6
	// may abort the next one if it arrives before its abort window closes).
	KeepQueue bool
}

// StartFrontend starts a frontend on k's connection file and waits (60 s)
// until the kernel answers kernel_info. It is stopped in t.Cleanup.
func StartFrontend(t testing.TB, k *Kernel) *Frontend {
	t.Helper()
	Require(t, "jupyter_client")
	script := filepath.Join(t.TempDir(), "frontend.py")
	if err := os.WriteFile(script, []byte(notebookFrontendPy), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Python(), script, k.ConnectionFile)
	cmd.Env = Env(k.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	f := &Frontend{cmd: cmd, stdin: stdin, lines: make(chan []byte, 1), done: make(chan struct{}),
		stderr: &strings.Builder{}, errMu: &sync.Mutex{}}
	cmd.Stderr = lockedWriter{f.errMu, f.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start frontend: %v", err)
	}
	f.start, _ = procStart(cmd.Process.Pid) // not reaped before the reader's Wait
	// The one reader of stdout; it ends at EOF, when the process exits.
	go func() {
		defer close(f.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 256<<20)
		for sc.Scan() {
			line := append([]byte(nil), sc.Bytes()...)
			f.lines <- line
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() { f.stop() })
	ready, err := f.read(context.Background(), 90*time.Second)
	if err != nil {
		t.Fatalf("frontend on %s: %v\n%s", k.ConnectionFile, err, f.Stderr())
	}
	var r struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(ready, &r); err != nil || !r.OK {
		t.Fatalf("frontend on %s not ready: %s %v\n%s", k.ConnectionFile, r.Error, err, f.Stderr())
	}
	return f
}

// Stderr returns what the frontend process wrote to stderr.
func (f *Frontend) Stderr() string {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	return f.stderr.String()
}

func (f *Frontend) stop() {
	_ = f.stdin.Close()
	if f.cmd.Process != nil {
		killGroup(f.cmd.Process.Pid, f.start)
	}
	// Drain so the reader goroutine can finish.
	for {
		select {
		case <-f.lines:
		case <-f.done:
			return
		case <-time.After(10 * time.Second):
			return
		}
	}
}

func (f *Frontend) read(ctx context.Context, timeout time.Duration) ([]byte, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case line := <-f.lines:
		return line, nil
	case <-f.done:
		return nil, errors.New("frontend exited")
	case <-timer.C:
		return nil, fmt.Errorf("no answer from the frontend within %v", timeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (f *Frontend) do(ctx context.Context, req map[string]any, timeout time.Duration) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.broken != nil {
		return nil, f.broken
	}
	req["timeout"] = timeout.Seconds()
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := f.stdin.Write(append(b, '\n')); err != nil {
		f.broken = fmt.Errorf("frontend: write: %w", err)
		return nil, f.broken
	}
	// The Python side gives up at timeout; wait a little longer for it.
	line, err := f.read(ctx, timeout+10*time.Second)
	if err != nil {
		f.broken = fmt.Errorf("frontend: %w (stderr: %s)", err, f.Stderr())
		return nil, f.broken
	}
	var r struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("frontend: decode %q: %w", line, err)
	}
	if !r.OK {
		return nil, fmt.Errorf("frontend: %s", r.Error)
	}
	return line, nil
}

// Execute sends one execute_request and returns its reply and outputs.
func (f *Frontend) Execute(ctx context.Context, req ExecuteRequest) (FrontendReply, error) {
	timeout := req.Timeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	ue := req.UserExpressions
	if ue == nil {
		ue = map[string]string{}
	}
	line, err := f.do(ctx, map[string]any{"op": "execute", "code": req.Code, "silent": req.Silent,
		"store_history": req.StoreHistory, "user_expressions": ue, "stop_on_error": !req.KeepQueue}, timeout)
	if err != nil {
		return FrontendReply{}, err
	}
	var r FrontendReply
	if err := json.Unmarshal(line, &r); err != nil {
		return FrontendReply{}, fmt.Errorf("frontend: decode reply: %w", err)
	}
	return r, nil
}

// KernelInfo returns the kernel_info_reply's content and header.
func (f *Frontend) KernelInfo(ctx context.Context) (content, header json.RawMessage, err error) {
	line, err := f.do(ctx, map[string]any{"op": "kernel_info"}, 30*time.Second)
	if err != nil {
		return nil, nil, err
	}
	var r struct {
		Reply  json.RawMessage `json:"reply"`
		Header json.RawMessage `json:"header"`
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, nil, fmt.Errorf("frontend: decode kernel_info: %w", err)
	}
	return r.Reply, r.Header, nil
}

// Cell runs code as a notebook cell (store_history, not silent) and fails
// the test if the request could not be made. A cell that raises is not a
// failure: look at the reply's status.
func (f *Frontend) Cell(t testing.TB, code string) FrontendReply {
	t.Helper()
	r, err := f.Execute(context.Background(), ExecuteRequest{Code: code, StoreHistory: true})
	if err != nil {
		t.Fatalf("cell %q: %v", code, err)
	}
	return r
}

// Status is the reply's status ("ok", "error", "aborted").
func (r FrontendReply) Status() string {
	var c struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(r.Reply, &c)
	return c.Status
}

// ExecutionCount is the reply's execution_count (the N of In[N]).
func (r FrontendReply) ExecutionCount() int {
	var c struct {
		ExecutionCount int `json:"execution_count"`
	}
	_ = json.Unmarshal(r.Reply, &c)
	return c.ExecutionCount
}

// Data returns the mime bundle of the first display_data or execute_result
// output carrying mime, decoded into out; false if none.
func (r FrontendReply) Data(mime string, out any) bool {
	for _, o := range r.Outputs {
		if o.Type != "display_data" && o.Type != "execute_result" {
			continue
		}
		var c struct {
			Data map[string]json.RawMessage `json:"data"`
		}
		if json.Unmarshal(o.Content, &c) != nil {
			continue
		}
		if raw, ok := c.Data[mime]; ok {
			if out != nil && json.Unmarshal(raw, out) != nil {
				continue
			}
			return true
		}
	}
	return false
}

// Text concatenates the outputs as a console would show them: streams,
// text/plain of results and displays, and error tracebacks' last lines.
func (r FrontendReply) Text() string {
	var b strings.Builder
	for _, o := range r.Outputs {
		var c struct {
			Text   string                     `json:"text"`
			Data   map[string]json.RawMessage `json:"data"`
			EName  string                     `json:"ename"`
			EValue string                     `json:"evalue"`
		}
		if json.Unmarshal(o.Content, &c) != nil {
			continue
		}
		switch o.Type {
		case "stream":
			b.WriteString(c.Text)
		case "error":
			fmt.Fprintf(&b, "%s: %s\n", c.EName, c.EValue)
		default:
			var s string
			if raw, ok := c.Data["text/plain"]; ok && json.Unmarshal(raw, &s) == nil {
				b.WriteString(s)
				b.WriteString("\n")
			}
		}
	}
	return b.String()
}
