// Package testenv starts real Jupyter parts for gpumem's integration tests:
// ipykernel kernels, Notebook 6 and jupyter_server servers, on 127.0.0.1 with
// temporary runtime dirs and tokens. It uses Debian's /usr/bin/python3.
//
// Under CI=true a missing Jupyter or torch fails the test; elsewhere it skips.
// Every wait polls with a deadline; every process started is killed (whole
// process group) in t.Cleanup.
package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Python is the interpreter whose Debian packages the tests need.
func Python() string {
	if p := os.Getenv("GPUMEM_TEST_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

var (
	probeOnce sync.Once
	probed    map[string]bool
)

func probeModules() map[string]bool {
	probeOnce.Do(func() {
		probed = map[string]bool{}
		for _, m := range []string{"ipykernel", "jupyter_client", "notebook", "jupyter_server", "torch"} {
			cmd := exec.Command(Python(), "-c", "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('"+m+"') else 1)")
			probed[m] = cmd.Run() == nil
		}
	})
	return probed
}

// Require fails (CI=true) or skips the test unless every named Python module
// is importable by Python(). Module names: ipykernel, jupyter_client,
// notebook, jupyter_server, torch.
func Require(t testing.TB, modules ...string) {
	t.Helper()
	have := probeModules()
	var missing []string
	for _, m := range modules {
		if !have[m] {
			missing = append(missing, m)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("%s lacks Python modules %v: run the README's test command (it installs them with apt-get)", Python(), missing)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// Poll calls cond every 20ms until it returns true or the deadline passes.
func Poll(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// RandomHex returns n random bytes as hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Env returns an environment for Jupyter processes confined to dir: runtime,
// config, data and IPython dirs all under it, nothing read from ~.
func Env(dir string, extra ...string) []string {
	env := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"HOME=" + filepath.Join(dir, "home"),
		"JUPYTER_RUNTIME_DIR=" + filepath.Join(dir, "runtime"),
		"JUPYTER_CONFIG_DIR=" + filepath.Join(dir, "config"),
		"JUPYTER_DATA_DIR=" + filepath.Join(dir, "data"),
		"IPYTHONDIR=" + filepath.Join(dir, "ipython"),
		"PYTHONUNBUFFERED=1",
		"PYDEVD_DISABLE_FILE_VALIDATION=1",
		"JUPYTER_PLATFORM_DIRS=1",
		"OMP_NUM_THREADS=1",
	}
	for _, k := range []string{"LANG", "LC_ALL", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "PYTHONPATH"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return append(env, extra...)
}

// Proc is a started process group.
type Proc struct {
	Cmd  *exec.Cmd
	Log  *bytes.Buffer
	mu   *sync.Mutex
	done chan struct{}
}

// Output returns what the process printed so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.Log.String()
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill kills the whole process group and waits for the leader.
func (p *Proc) Kill() {
	if p.Cmd.Process != nil {
		_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// Start starts argv in its own process group with env, and kills the group in
// t.Cleanup.
func Start(t testing.TB, env []string, dir string, argv ...string) *Proc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = dir
	p := &Proc{Cmd: cmd, Log: &bytes.Buffer{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	cmd.Stdout = lockedWriter{p.mu, p.Log}
	cmd.Stderr = lockedWriter{p.mu, p.Log}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(p.Kill)
	return p
}

// Kernel is a real ipykernel started from a connection file we wrote.
type Kernel struct {
	*Proc
	Dir            string // the test's Jupyter dir (runtime under it)
	ConnectionFile string
	Key            string
	ID             string
}

// ConnectionJSON writes a connection file with fresh ports and key.
func ConnectionJSON(t testing.TB, path, key string) {
	t.Helper()
	conn := map[string]any{
		"transport": "tcp", "ip": "127.0.0.1",
		"shell_port": FreePort(t), "iopub_port": FreePort(t), "stdin_port": FreePort(t),
		"control_port": FreePort(t), "hb_port": FreePort(t),
		"key": key, "signature_scheme": "hmac-sha256", "kernel_name": "python3",
	}
	b, _ := json.MarshalIndent(conn, "", "  ")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// StartKernel starts `python3 -m ipykernel_launcher -f <runtime>/kernel-<id>.json`
// (as `jupyter kernel` would, but with no server) in dir's runtime dir, and
// returns once the kernel has written that file. The kernel binds ports of
// its own choosing and writes them with a fresh key: ports picked here and
// freed before the kernel binds them could be taken in between by another
// test's connection. extraEnv is appended to the kernel's environment.
func StartKernel(t testing.TB, dir string, extraEnv ...string) *Kernel {
	t.Helper()
	Require(t, "ipykernel")
	id := fmt.Sprintf("%s-%s-%s-%s-%s", RandomHex(4), RandomHex(2), RandomHex(2), RandomHex(2), RandomHex(6))
	cf := filepath.Join(dir, "runtime", "kernel-"+id+".json")
	if err := os.MkdirAll(filepath.Dir(cf), 0o700); err != nil {
		t.Fatal(err)
	}
	p := Start(t, Env(dir, extraEnv...), dir, Python(), "-m", "ipykernel_launcher", "-f", cf)
	var conn struct {
		Key       *string `json:"key"`
		ShellPort int     `json:"shell_port"`
		HBPort    int     `json:"hb_port"`
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(cf); err == nil && json.Unmarshal(b, &conn) == nil &&
			conn.Key != nil && conn.ShellPort > 0 && conn.HBPort > 0 {
			break
		}
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("kernel did not write %s: %s", cf, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &Kernel{Proc: p, Dir: dir, ConnectionFile: cf, Key: *conn.Key, ID: id}
}

// ServerKind selects the Jupyter server implementation.
type ServerKind string

const (
	Notebook6     ServerKind = "notebook"       // nbserver-<pid>.json
	JupyterServer ServerKind = "jupyter_server" // jpserver-<pid>.json
)

// Server is a real Jupyter server on 127.0.0.1.
type Server struct {
	*Proc
	Kind    ServerKind
	Dir     string // Jupyter dirs live under it
	RootDir string // notebooks' root
	URL     string // http://127.0.0.1:PORT/
	Token   string
	client  *http.Client
}

// RuntimeDir is where the server writes kernel connection files.
func (s *Server) RuntimeDir() string { return filepath.Join(s.Dir, "runtime") }

// StartServer starts a server of kind with a temporary runtime dir, root dir
// and token, and waits (deadline 60s) until it answers /api/status.
func StartServer(t testing.TB, kind ServerKind, extraEnv ...string) *Server {
	t.Helper()
	Require(t, "ipykernel", "jupyter_client", string(kind))
	dir := t.TempDir()
	root := filepath.Join(dir, "notebooks")
	for _, d := range []string{root, filepath.Join(dir, "runtime"), filepath.Join(dir, "home")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	port := FreePort(t)
	token := RandomHex(16)
	args := []string{Python(), "-m", string(kind),
		"--no-browser", "--ip=127.0.0.1", "--port=" + strconv.Itoa(port), "--port-retries=0",
		"--allow-root"}
	if kind == Notebook6 {
		args = append(args, "--NotebookApp.token="+token, "--NotebookApp.notebook_dir="+root,
			"--NotebookApp.open_browser=False")
	} else {
		args = append(args, "--ServerApp.token="+token, "--ServerApp.root_dir="+root)
	}
	p := Start(t, Env(dir, extraEnv...), dir, args...)
	s := &Server{Proc: p, Kind: kind, Dir: dir, RootDir: root, Token: token,
		URL: fmt.Sprintf("http://127.0.0.1:%d/", port), client: &http.Client{Timeout: 30 * time.Second}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := s.Do(http.MethodGet, "api/status", nil)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("%s did not come up on %s: %v\n%s", kind, s.URL, err, p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

// Do sends an authenticated request to the server.
func (s *Server) Do(method, path string, body any) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, s.URL+strings.TrimPrefix(path, "/"), r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "token "+s.Token)
	req.Header.Set("Content-Type", "application/json")
	return s.client.Do(req)
}

// JSON sends a request and decodes the JSON reply into out (if non-nil),
// failing the test on a status outside 2xx.
func (s *Server) JSON(t testing.TB, method, path string, body, out any) {
	t.Helper()
	resp, err := s.Do(method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
}

// Session is what POST /api/sessions returns (the parts tests use).
type Session struct {
	ID     string `json:"id"`
	Path   string `json:"path"`
	Kernel struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"kernel"`
}

// CreateSession creates an empty notebook at path (relative to the root,
// folders created) and a session with a python3 kernel for it, and waits
// until the kernel's connection file exists. It returns the session.
func (s *Server) CreateSession(t testing.TB, path string) Session {
	t.Helper()
	full := filepath.Join(s.RootDir, filepath.FromSlash(path))
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(full); errors.Is(err, os.ErrNotExist) {
		nb := `{"cells":[],"metadata":{"kernelspec":{"name":"python3","display_name":"Python 3","language":"python"}},"nbformat":4,"nbformat_minor":5}`
		if err := os.WriteFile(full, []byte(nb), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var sess Session
	s.JSON(t, http.MethodPost, "api/sessions", map[string]any{
		"path": path, "name": filepath.Base(path), "type": "notebook",
		"kernel": map[string]any{"name": "python3"},
	}, &sess)
	cf := s.ConnectionFile(sess.Kernel.ID)
	Poll(t, 30*time.Second, "connection file "+cf, func() bool {
		_, err := os.Stat(cf)
		return err == nil
	})
	return sess
}

// ConnectionFile is the path of a server-managed kernel's connection file.
func (s *Server) ConnectionFile(kernelID string) string {
	return filepath.Join(s.RuntimeDir(), "kernel-"+kernelID+".json")
}
