// Package serve holds end-to-end scenarios of `gpumem serve`: the real
// binary against a real Notebook 6 server and real kernels, with a
// simulated-GPU file listing real pids.
package serve

import (
	"bufio"
	"context"
	"encoding/json"
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

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
)

var gpumemBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gpumem-serve-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gpumemBin = filepath.Join(dir, "gpumem")
	build := exec.Command("go", "build", "-race", "-o", gpumemBin, "../../cmd/gpumem")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building gpumem:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fakeGPU is the simulated-GPU file; the daemon re-reads it every sample.
type fakeGPU struct {
	path string
	mu   sync.Mutex
}

type fakeProc struct {
	PID       int    `json:"pid"`
	UsedBytes uint64 `json:"used_bytes"`
}

func newFakeGPU(t *testing.T) *fakeGPU {
	f := &fakeGPU{path: filepath.Join(t.TempDir(), "gpus.json")}
	f.set(t)
	return f
}

// set lists procs on one simulated 80 GiB GPU.
func (f *fakeGPU) set(t *testing.T, procs ...fakeProc) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if procs == nil {
		procs = []fakeProc{}
	}
	doc := map[string]any{"gpus": []any{map[string]any{
		"name": "Simulated H200", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
		"memory_total_bytes": uint64(80 << 30), "processes": procs,
	}}}
	b, _ := json.Marshal(doc)
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.path); err != nil { // atomic: never a half file
		t.Fatal(err)
	}
}

// daemon is a running `gpumem serve`.
type daemon struct {
	cmd    *exec.Cmd
	socket string
	done   chan struct{}
	mu     sync.Mutex
	logs   []map[string]any
	raw    strings.Builder
	client *api.Client
}

// startDaemon runs gpumem serve on srv's runtime dir and waits (30 s) until
// its API answers.
func startDaemon(t *testing.T, srv *testenv.Server, gpu *fakeGPU, args ...string) *daemon {
	t.Helper()
	d := tryStartDaemon(t, srv, gpu, args...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := d.client.Healthz(ctx)
		cancel()
		if err == nil {
			return d
		}
		if d.exited() || time.Now().After(deadline) {
			t.Fatalf("daemon did not come up: %v\n%s", err, d.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tryStartDaemon(t *testing.T, srv *testenv.Server, gpu *fakeGPU, args ...string) *daemon {
	t.Helper()
	sock := filepath.Join(srv.RuntimeDir(), "gpumem.sock")
	for _, a := range args {
		if strings.HasPrefix(a, "--socket=") {
			sock = strings.TrimPrefix(a, "--socket=")
		}
	}
	cmd := exec.Command(gpumemBin, append([]string{"serve", "--log-format=json", "--log-level=debug"}, args...)...)
	cmd.Env = testenv.Env(srv.Dir, "GPUMEM_FAKE_GPU="+gpu.path)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, socket: sock, done: make(chan struct{}), client: api.NewClient(sock)}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var m map[string]any
			d.mu.Lock()
			d.raw.WriteString(line + "\n")
			if json.Unmarshal([]byte(line), &m) == nil {
				d.logs = append(d.logs, m)
			}
			d.mu.Unlock()
		}
		_ = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		d.stop(syscall.SIGKILL)
		d.client.Close()
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.output())
		}
	})
	return d
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *daemon) stop(sig syscall.Signal) {
	if !d.exited() {
		_ = d.cmd.Process.Signal(sig)
	}
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

func (d *daemon) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.raw.String()
}

// findLog returns the first log entry whose message is msg and whose fields
// include every key/value of want (values compared as fmt %v).
func (d *daemon) findLog(msg string, want map[string]any) (map[string]any, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range d.logs {
		if m["message"] != msg {
			continue
		}
		ok := true
		for k, v := range want {
			if fmt.Sprint(m[k]) != fmt.Sprint(v) {
				ok = false
				break
			}
		}
		if ok {
			return m, true
		}
	}
	return nil, false
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

func readAll(r io.Reader) string {
	b, _ := io.ReadAll(r)
	return string(b)
}
