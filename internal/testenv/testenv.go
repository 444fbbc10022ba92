// Package testenv starts real Jupyter parts for gpumem's integration tests:
// ipykernel kernels, Notebook 6/7, JupyterLab and jupyter_server servers, on
// 127.0.0.1 (or a unix socket) with temporary runtime dirs and tokens. The
// stack under test (Debian 12's packages or a pinned virtualenv) is chosen by
// GPUMEM_TEST_STACK; see Stack.
//
// Under CI=true a missing Jupyter or torch fails the test; elsewhere it skips.
// Under go test -short (the unit path) every test that needs a real Jupyter
// part skips, CI=true or not: -short is an explicit request for the unit
// tests alone, not a machine that lacks the parts (Require says so; whole
// end-to-end packages skip in their TestMain: ShortSkipsPackage).
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
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	probeOnce sync.Once
	probed    map[string]bool
)

func probeModules() map[string]bool {
	probeOnce.Do(func() {
		probed = map[string]bool{}
		for _, m := range []string{"ipykernel", "jupyter_client", "notebook", "jupyter_server", "jupyterlab", "nbclient", "papermill", "jupyter_console", "torch"} {
			cmd := exec.Command(Python(), "-c", "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('"+m+"') else 1)")
			probed[m] = cmd.Run() == nil
		}
	})
	return probed
}

// Require fails (CI=true) or skips the test unless every named Python module
// is importable by Python(). Module names: ipykernel, jupyter_client,
// notebook, jupyter_server, jupyterlab, nbclient, papermill, jupyter_console,
// torch.
func Require(t testing.TB, modules ...string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs Python modules %v of a real Jupyter stack: skipped under -short (the unit path)", modules)
	}
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
	Missing(t, fmt.Sprintf("stack %s: %s lacks Python modules %v: %s", CurrentStack(), Python(), missing, stackHint()))
}

// ShortSkipsPackage is for the TestMain of a package of end-to-end tests
// only: under -short it says so on stdout and returns true, and the
// TestMain returns 0 without building or running anything.
func ShortSkipsPackage() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	if !testing.Short() {
		return false
	}
	fmt.Println("end-to-end package: skipped under -short (the unit path)")
	return true
}

// Missing ends a test that lacks a real part it needs: it fails under
// CI=true, where every part must be there, and skips elsewhere. msg says
// what is missing and how to get it.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// RequireRoot calls Missing(t, why) unless the test runs as root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, why)
	}
}

// Poll calls cond every 20ms until it returns true or the deadline passes.
func Poll(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Eventually is Poll without failing: it reports whether cond came true
// before the deadline, for a test that reports its figures either way.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// drawn at random below Linux's ephemeral range: a port taken from that
// range (by a bind to port 0) is the kind the kernels' own ports and every
// outgoing connection take next, so between this call and the bind of the
// test's server another process took it now and then ("address already in
// use"); below the range only another draw like this one can collide.
func FreePort(t testing.TB) int {
	t.Helper()
	low := ephemeralLow()
	for try := 0; try < 200 && low > minTestPort; try++ {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(low-minTestPort)))
		if err != nil {
			break
		}
		port := minTestPort + int(n.Int64())
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			return port
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// minTestPort is the lowest port FreePort draws: above the ports services
// are configured on.
const minTestPort = 20000

// ephemeralLow is the first port of Linux's ephemeral range (the ports a
// bind to port 0 and every outgoing connection take), 32768 when it cannot
// be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				return n
			}
		}
	}
	return 32768
}

// ServeLoopback listens on a free port of 127.0.0.1 until the test ends,
// passes each connection to handle and then closes it; it returns the port.
func ServeLoopback(t testing.TB, handle func(net.Conn)) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on loopback: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return // closed at the test's end
			}
			handle(c)
			c.Close()
		}
	}()
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
		"PATH=" + BinDir() + ":/usr/local/bin:/usr/bin:/bin",
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
	Cmd   *exec.Cmd
	Log   *bytes.Buffer
	mu    *sync.Mutex
	done  chan struct{}
	start uint64 // the leader's start time, which Kill checks before signalling its group
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
		killGroup(p.Cmd.Process.Pid, p.start)
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
	return StartAs(t, nil, env, dir, argv...)
}

// StartAs is Start as user u (its uid and gid; nil: this process's).
func StartAs(t testing.TB, u *User, env []string, dir string, argv ...string) *Proc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = dir
	if u != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID)}}
	}
	return StartCmd(t, cmd)
}

// StartCmd starts cmd (a User's Command, say) in its own process group,
// keeping its output, and kills the group in t.Cleanup.
func StartCmd(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Cmd: cmd, Log: &bytes.Buffer{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	cmd.Stdout = lockedWriter{p.mu, p.Log}
	cmd.Stderr = lockedWriter{p.mu, p.Log}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	p.start, _ = procStart(cmd.Process.Pid) // not reaped before Wait, below
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
	return StartKernelID(t, dir, NewKernelID(), extraEnv...)
}

// NewKernelID is a fresh kernel id shaped as Jupyter's (a UUID).
func NewKernelID() string {
	return fmt.Sprintf("%s-%s-%s-%s-%s", RandomHex(4), RandomHex(2), RandomHex(2), RandomHex(2), RandomHex(6))
}

// StartKernelID is StartKernel with the kernel id (the file's
// kernel-<id>.json) chosen by the caller: any bytes a file name may hold.
func StartKernelID(t testing.TB, dir, id string, extraEnv ...string) *Kernel {
	t.Helper()
	Require(t, "ipykernel")
	cf := filepath.Join(dir, "runtime", "kernel-"+id+".json")
	if err := os.MkdirAll(filepath.Dir(cf), 0o700); err != nil {
		t.Fatal(err)
	}
	p := Start(t, Env(dir, extraEnv...), dir, Python(), "-m", "ipykernel_launcher", "-f", cf)
	k := waitKernelFile(t, p, cf)
	k.Dir, k.ID = dir, id
	return k
}

// waitKernelFile waits (60 s) until the kernel p writes its connection file
// cf with its ports and key.
func waitKernelFile(t testing.TB, p *Proc, cf string) *Kernel {
	t.Helper()
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
	return &Kernel{Proc: p, ConnectionFile: cf, Key: *conn.Key}
}

// ServerKind selects the Jupyter server implementation.
type ServerKind string

const (
	Notebook6     ServerKind = "notebook"       // Notebook 6 (Debian 12): nbserver-<pid>.json
	JupyterServer ServerKind = "jupyter_server" // bare jupyter_server: jpserver-<pid>.json
	JupyterLab    ServerKind = "jupyterlab"     // `jupyter lab` (JupyterLab 4 on jupyter_server 2)
	Notebook7     ServerKind = "notebook7"      // `jupyter notebook` (Notebook 7 on jupyter_server 2)
)

// module is the Python module that runs the server (python -m MODULE).
func (k ServerKind) module() string {
	switch k {
	case Notebook7:
		return "notebook"
	default:
		return string(k)
	}
}

// InfoPrefix is the prefix of the server's info file in the runtime dir.
func (k ServerKind) InfoPrefix() string {
	if k == Notebook6 {
		return "nbserver-"
	}
	return "jpserver-"
}

// ServerOptions are a server's optional settings.
type ServerOptions struct {
	// BaseURL, e.g. "/user/alice/" as JupyterHub gives each user; "" = "/".
	BaseURL string
	// Sock makes the server listen on a unix socket (ServerApp.sock) in its
	// dir instead of a TCP port.
	Sock bool
	// Password makes the server ask for a password and hold no token (its
	// info file then has "token": ""); the test logs in with a cookie.
	Password string
	// Args are appended to the command line (e.g. culling settings).
	Args []string
	// Env is appended to the server's environment.
	Env []string
	// As runs the server as this user (MakeUser), its dirs (runtime dir
	// included) made in the user's home and owned by the user; nil: as
	// this process.
	As *User
}

// Server is a real Jupyter server on 127.0.0.1.
type Server struct {
	*Proc
	Kind    ServerKind
	Dir     string // Jupyter dirs live under it
	RootDir string // notebooks' root
	URL     string // as its info file says: http://127.0.0.1:PORT/BASE/ or http+unix://SOCK/BASE/
	Token   string // "" with a password
	Sock    string // the unix socket, "" on TCP
	BaseURL string // "/" unless set

	As *User // the user it runs as; nil: this process's

	reqBase string // scheme://host/base/ requests go to
	client  *http.Client
	xsrf    string // the _xsrf cookie after a password login
}

// RuntimeDir is where the server writes kernel connection files.
func (s *Server) RuntimeDir() string { return filepath.Join(s.Dir, "runtime") }

// StartServer starts a server of kind with a temporary runtime dir, root dir
// and token, and waits (deadline 60s) until it answers /api/status.
func StartServer(t testing.TB, kind ServerKind, extraEnv ...string) *Server {
	t.Helper()
	return StartServerWith(t, kind, ServerOptions{Env: extraEnv})
}

// StartServerWith is StartServer with options.
func StartServerWith(t testing.TB, kind ServerKind, o ServerOptions) *Server {
	t.Helper()
	Require(t, "ipykernel", "jupyter_client", kind.module())
	if (kind == Notebook6 || kind == Notebook7) && kind != NotebookServer() {
		t.Fatalf("stack %s has no %s server (its `jupyter notebook` is %s)", CurrentStack(), kind, NotebookServer())
	}
	s := newServerDirs(t, kind, o)
	app := "--ServerApp."
	if kind == Notebook6 {
		app = "--NotebookApp."
	}
	args := []string{Python(), "-m", kind.module(), "--no-browser", "--allow-root",
		app + "open_browser=False", app + "base_url=" + s.BaseURL,
		// Where jupyterlab-gpumem is installed, its server extension would
		// start a daemon of its own: these tests start theirs.
		"--Gpumem.autostart=False"}
	tr := &http.Transport{DisableKeepAlives: true}
	listenArgs, fixedPort := s.listenArgs(t, o.Sock, app, tr)
	args = append(args, listenArgs...)
	args = append(args, s.authArgs(t, o.Password)...)
	args = append(args, o.Args...)
	s.client = &http.Client{Timeout: 30 * time.Second, Transport: tr}
	if o.Password != "" {
		jar, err := cookiejar.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		s.client.Jar = jar
	}
	s.startUp(t, o, args, fixedPort)
	if o.Password != "" {
		s.login(t, o.Password)
	}
	return s
}

// newServerDirs makes a server's dirs in a temporary dir (o.As's when
// set, and owned by that user, as whom the server runs): the
// notebooks' root, the runtime dir and a home. It returns the Server of
// kind there, with its base URL and token (none with a password), not
// started.
func newServerDirs(t testing.TB, kind ServerKind, o ServerOptions) *Server {
	t.Helper()
	dir := t.TempDir()
	if o.As != nil {
		dir = o.As.TempDir(t)
	}
	root := filepath.Join(dir, "notebooks")
	for _, d := range []string{root, filepath.Join(dir, "runtime"), filepath.Join(dir, "home")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		o.As.Chown(t, d)
	}
	base := o.BaseURL
	if base == "" {
		base = "/"
	}
	token := RandomHex(16)
	if o.Password != "" {
		token = ""
	}
	return &Server{Kind: kind, Dir: dir, RootDir: root, Token: token, BaseURL: base, As: o.As}
}

// listenArgs are the arguments that say where s listens (app is the
// option prefix of its kind), with tr set to reach it there: a unix
// socket when sock, else a TCP port of 127.0.0.1. fixedPort says the port
// is to be picked at each start (startUp), as a server that cannot take
// --port=0 needs.
func (s *Server) listenArgs(t testing.TB, sock bool, app string, tr *http.Transport) (args []string, fixedPort bool) {
	t.Helper()
	switch {
	case sock:
		// A short path: unix socket paths are limited to 107 bytes.
		sockDir, err := os.MkdirTemp("", "gpumem-sock-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
		s.Sock = filepath.Join(sockDir, "jupyter.sock")
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", s.Sock)
		}
		s.URL = "http+unix://" + strings.ReplaceAll(s.Sock, "/", "%2F") + s.BaseURL
		s.reqBase = "http://localhost" + s.BaseURL
		return []string{app + "sock=" + s.Sock}, false
	case portZero(s.Kind):
		// The server binds a port of its own choosing and writes it in its
		// info file: a port picked here and freed could be taken (by a
		// kernel of another test) before the server binds it.
		return []string{"--ip=127.0.0.1", "--port=0"}, false
	default:
		// A port picked here and freed can be taken (by another test's
		// kernel) before the server binds it: the server then exits saying
		// so, and is started again on another port (startUp).
		return nil, true
	}
}

// authArgs are the arguments of s's token, root dir and, when password is
// set, hashed password, in the options of its kind and stack.
func (s *Server) authArgs(t testing.TB, password string) []string {
	t.Helper()
	if s.Kind == Notebook6 {
		args := []string{"--NotebookApp.token=" + s.Token, "--NotebookApp.notebook_dir=" + s.RootDir}
		if password != "" {
			args = append(args, "--NotebookApp.password="+hashPassword(t, s.Kind, password))
		}
		return args
	}
	args := []string{"--ServerApp.token=" + s.Token, "--ServerApp.root_dir=" + s.RootDir}
	if password != "" {
		opt := "--PasswordIdentityProvider.hashed_password=" // jupyter_server 2
		if CurrentStack() == Debian12 {
			opt = "--ServerApp.password=" // jupyter_server 1
		}
		args = append(args, opt+hashPassword(t, s.Kind, password))
	}
	return args
}

// startUp starts the server with args and waits (60 s in all) until it
// answers. With fixedPort each attempt picks a free port, and a server
// whose port was taken meanwhile is started again (5 attempts in all).
func (s *Server) startUp(t testing.TB, o ServerOptions, args []string, fixedPort bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for attempt := 1; ; attempt++ {
		argv := args
		if fixedPort {
			port := FreePort(t)
			argv = append(slices.Clip(args), "--ip=127.0.0.1", "--port="+strconv.Itoa(port), "--port-retries=0")
			s.URL = fmt.Sprintf("http://127.0.0.1:%d%s", port, s.BaseURL)
			s.reqBase = s.URL
		}
		s.Proc = StartAs(t, o.As, Env(s.Dir, o.Env...), s.Dir, argv...)
		if !fixedPort && !o.Sock {
			s.URL = s.waitInfoURL(t, deadline)
			s.reqBase = s.URL
		}
		err := s.waitUp(o.Password != "", deadline)
		if err == nil {
			return
		}
		if fixedPort && s.Exited() && portTaken(s.Output()) && attempt < 5 {
			continue
		}
		t.Fatalf("%s did not come up on %s: %v\n%s", s.Kind, s.URL, err, s.Output())
	}
}

// waitUp polls the server's api/status until it answers (before a
// password login a 403 says it is up too), it exits, or deadline passes.
func (s *Server) waitUp(password bool, deadline time.Time) error {
	for {
		resp, err := s.Do(http.MethodGet, "api/status", nil)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 || (password && resp.StatusCode == 403) {
				return nil
			}
			err = fmt.Errorf("api/status answered %s", resp.Status)
		}
		if s.Exited() {
			return fmt.Errorf("the server exited: %v", err)
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// portTaken reports whether a server's output says its port was taken
// (Notebook 6 and jupyter_server 1 with --port-retries=0).
func portTaken(output string) bool {
	return strings.Contains(output, "is already in use") || strings.Contains(output, "is not available")
}

// portZero reports whether kind, on this stack, takes --port=0 and writes
// the port it bound into its info file: jupyter_server 2 does; jupyter_server
// 1.23 and Notebook 6 write port 0.
func portZero(kind ServerKind) bool {
	return kind != Notebook6 && CurrentStack() == Current
}

// waitInfoURL waits for the server's jpserver-<pid>.json and returns its url.
func (s *Server) waitInfoURL(t testing.TB, deadline time.Time) string {
	t.Helper()
	file := filepath.Join(s.RuntimeDir(), fmt.Sprintf("%s%d.json", s.Kind.InfoPrefix(), s.Cmd.Process.Pid))
	for {
		var info struct {
			URL string `json:"url"`
		}
		if b, err := os.ReadFile(file); err == nil && json.Unmarshal(b, &info) == nil && info.URL != "" {
			return info.URL
		}
		if s.Exited() || time.Now().After(deadline) {
			t.Fatalf("%s wrote no %s:\n%s", s.Kind, file, s.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hashPassword hashes pw as kind expects it.
func hashPassword(t testing.TB, kind ServerKind, pw string) string {
	t.Helper()
	mod := "jupyter_server.auth"
	if kind == Notebook6 {
		mod = "notebook.auth"
	}
	out, err := exec.Command(Python(), "-c", "import sys; from "+mod+" import passwd; print(passwd(sys.argv[1]))", pw).Output()
	if err != nil {
		t.Fatalf("hashing a password with %s: %v", mod, err)
	}
	return strings.TrimSpace(string(out))
}

// login logs in with the password form, as a browser does: GET /login sets
// the _xsrf cookie, POST /login with it sets the login cookie.
func (s *Server) login(t testing.TB, pw string) {
	t.Helper()
	resp, err := s.client.Get(s.reqBase + "login")
	if err != nil {
		t.Fatalf("GET login: %v", err)
	}
	resp.Body.Close()
	u, _ := url.Parse(s.reqBase)
	for _, c := range s.client.Jar.Cookies(u) {
		if c.Name == "_xsrf" {
			s.xsrf = c.Value
		}
	}
	form := url.Values{"password": {pw}, "_xsrf": {s.xsrf}}
	noRedirect := *s.client
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err = noRedirect.PostForm(s.reqBase+"login", form)
	if err != nil {
		t.Fatalf("POST login: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound && resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST login: %s, want a redirect\n%s", resp.Status, s.Output())
	}
}

// Do sends an authenticated request to the server.
func (s *Server) Do(method, path string, body any) (*http.Response, error) {
	req, err := JSONRequest(method, s.reqBase+strings.TrimPrefix(path, "/"), s.Token, body)
	if err != nil {
		return nil, err
	}
	if s.xsrf != "" {
		req.Header.Set("X-XSRFToken", s.xsrf)
	}
	return s.client.Do(req)
}

// JSONRequest is a request to a Jupyter-style REST API: body (if not nil)
// as JSON, and the token (if any) in the Authorization header.
func JSONRequest(method, url, token string, body any) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, url, r)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "token "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

// JSON sends a request and decodes the JSON reply into out (if non-nil),
// failing the test on a status outside 2xx.
func (s *Server) JSON(t testing.TB, method, path string, body, out any) {
	t.Helper()
	resp, err := s.Do(method, path, body)
	ReplyJSON(t, method+" "+path, resp, err, out)
}

// ReplyJSON checks a request's outcome and decodes its JSON reply into out
// (if non-nil), failing the test on an error or a status outside 2xx; what
// names the request in the failure.
func ReplyJSON(t testing.TB, what string, resp *http.Response, err error, out any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s: %s: %s", what, resp.Status, b)
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: decode %q: %v", what, b, err)
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
// until that kernel listens on its ports. It returns the session.
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
		s.As.Chown(t, full)
	}
	var sess Session
	s.JSON(t, http.MethodPost, "api/sessions", map[string]any{
		"path": path, "name": filepath.Base(path), "type": "notebook",
		"kernel": map[string]any{"name": "python3"},
	}, &sess)
	// The server writes the connection file before its kernel binds the
	// ports in it, and until then nothing can prove which process is the
	// kernel: callers get a session whose kernel listens.
	WaitKernelListening(t, s.ConnectionFile(sess.Kernel.ID), 60*time.Second)
	return sess
}

// ConnectionFile is the path of a server-managed kernel's connection file.
func (s *Server) ConnectionFile(kernelID string) string {
	return filepath.Join(s.RuntimeDir(), "kernel-"+kernelID+".json")
}
