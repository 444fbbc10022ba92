package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpumem/gpumem/examples"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/nvml/driver"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
)

// `gpumem demo` is the way to try gpumem with nothing but the wheel: it
// starts the JupyterLab installed beside gpumem, on 127.0.0.1 with a token,
// in a dir of its own (runtime dir, notebook, settings, logs), opens a kernel
// for the example notebook and waits until the daemon that JupyterLab's
// extension starts follows it. Without an NVIDIA driver the GPU is
// simulated: a file that the example's kernels keep (examples'
// SimulatedGPUStartup), shown as "simulated" everywhere. Ctrl-C stops
// JupyterLab, which stops its daemon and kernels.

// demoNotebook is the example's name in the demo's notebook dir.
const demoNotebook = "leaks.ipynb"

// demoGPUFile is the demo's simulated GPU before any kernel starts: one
// H200, as nvml's simulated-GPU file writes it.
const demoGPUFile = `{"gpus":[{"name":"Simulated H200","uuid":"GPU-simulated-0","memory_total_bytes":150754820096,"processes":[]}]}`

// demoHeld is what the example's kernel holds of the simulated GPU.
const demoHeld = 3 << 30

// Deadlines of the demo's start: JupyterLab's first start compiles
// nothing, but a cold disk and Python's imports take a while.
const (
	demoServerWait = 90 * time.Second
	demoDaemonWait = 30 * time.Second
	demoKernelWait = 60 * time.Second
	demoStopWait   = 30 * time.Second
)

func runDemo(ctx context.Context, env Env, args []string) error {
	fs := newFlagSet(env, "demo", "[--dir DIR] [--port N] [--metrics ADDR] [--simulated]")
	dirFlag := fs.String("dir", "", "keep the demo's runtime dir, notebook, settings and logs in `DIR` (made if missing; default: a new temporary dir, removed at exit)")
	port := fs.Int("port", 8888, "JupyterLab's first `port` to try on 127.0.0.1 (the next free one if taken)")
	metrics := fs.String("metrics", "", "have the daemon serve Prometheus metrics on `ADDR` (serve's --listen, such as 127.0.0.1:9464)")
	simulated := fs.Bool("simulated", false, "simulate the GPU even where an NVIDIA driver is found")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	if *port < 1 || *port > 65535 {
		return fmt.Errorf("%w: --port=%d: want 1 to 65535", errUsage, *port)
	}
	if *dirFlag != "" {
		if abs, err := filepath.Abs(*dirFlag); err == nil && len(demoSocket(abs)) > api.MaxSocketPath {
			return fmt.Errorf("%w: --dir %s: the daemon's socket in it would be %d bytes long, Linux allows %d: choose a shorter dir",
				errUsage, abs, len(demoSocket(abs)), api.MaxSocketPath)
		}
	}
	lab, err := findJupyterLab()
	if err != nil {
		return err
	}
	if !*simulated {
		*simulated = !driverPresent()
	}
	dir, keep := *dirFlag, *dirFlag != ""
	if keep {
		if dir, err = filepath.Abs(dir); err == nil {
			err = os.MkdirAll(dir, 0o700)
		}
	} else {
		dir, err = demoTempDir()
	}
	if err != nil {
		return fmt.Errorf("the demo's dir: %w", err)
	}
	d := &demo{env: env, dir: dir, lab: lab, port: *port, metrics: *metrics, simulated: *simulated}
	err = d.run(ctx)
	if !keep {
		if err == nil {
			_ = os.RemoveAll(dir)
		} else {
			fmt.Fprintf(env.Stderr, "gpumem demo: its logs are kept in %s\n", dir)
		}
	}
	return err
}

// findJupyterLab is the jupyter-lab installed beside this binary (the
// wheel's environment), else the first on PATH.
func findJupyterLab() (string, error) {
	if self, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(self), "jupyter-lab")
		if fi, err := os.Stat(beside); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return beside, nil
		}
	}
	if p, err := exec.LookPath("jupyter-lab"); err == nil {
		return p, nil
	}
	return "", errors.New("no JupyterLab found (jupyter-lab, beside gpumem or on PATH): pip install jupyterlab-gpumem into an environment, which brings JupyterLab, and run that environment's gpumem demo")
}

// driverPresent reports whether NVML opens here.
func driverPresent() bool {
	src, err := driver.Open(driver.Options{})
	if err != nil {
		return false
	}
	defer src.Close()
	return src.InitErr() == nil
}

// demo is one run of `gpumem demo`.
type demo struct {
	env       Env
	dir       string
	lab       string
	port      int
	metrics   string
	simulated bool
	token     string
	cmd       *exec.Cmd
	exited    chan struct{} // closed when JupyterLab has exited
	url       string        // JupyterLab's base URL, from its server file
	daemonPID int           // the daemon JupyterLab's extension started (0: none)
}

func (d *demo) runtimeDir() string { return demoRuntimeDir(d.dir) }

// demoRuntimeDir is the runtime dir of a demo in dir, and demoSocket the
// daemon's socket there.
func demoRuntimeDir(dir string) string { return filepath.Join(dir, "runtime") }
func demoSocket(dir string) string     { return filepath.Join(demoRuntimeDir(dir), api.DefaultSocketName) }

// demoTempDir makes the demo's own temporary dir: under $TMPDIR, or under
// /tmp where $TMPDIR is so deep that the daemon's socket inside would not
// fit a unix socket's path.
func demoTempDir() (string, error) {
	parent := os.TempDir()
	// The longest name MkdirTemp makes (its suffix has up to 10 digits):
	// the choice does not depend on the draw.
	if len(demoSocket(filepath.Join(parent, "gpumem-demo-0123456789"))) > api.MaxSocketPath {
		parent = "/tmp"
	}
	return os.MkdirTemp(parent, "gpumem-demo-")
}
func (d *demo) gpuFile() string { return filepath.Join(d.dir, "gpus.json") }
func (d *demo) logFile() string { return filepath.Join(d.dir, "jupyter.log") }

func (d *demo) run(ctx context.Context) error {
	if err := d.prepare(); err != nil {
		return err
	}
	if err := d.start(); err != nil {
		return err
	}
	err := d.ready(ctx)
	if err == nil {
		select {
		case <-ctx.Done():
		case <-d.exited:
			err = fmt.Errorf("JupyterLab exited (%s): see %s", d.cmd.ProcessState, d.logFile())
		}
	}
	if stopErr := d.stop(); err == nil {
		err = stopErr
	}
	return err
}

// prepare writes the demo's dir: its runtime dir, the notebook, the
// settings and, when simulated, the GPU file and the kernels' start-up
// file. A token is drawn.
func (d *demo) prepare() error {
	tok := make([]byte, 24)
	if _, err := rand.Read(tok); err != nil {
		return fmt.Errorf("drawing the token: %w", err)
	}
	d.token = hex.EncodeToString(tok)
	serveArgs := "[]"
	if d.metrics != "" {
		b, _ := json.Marshal([]string{"--listen=" + d.metrics})
		serveArgs = string(b)
	}
	files := []demoFile{
		{filepath.Join(d.dir, "notebooks", demoNotebook), examples.LeaksNotebook},
		// The daemon's settings; JupyterLab asks no "news?" question.
		{filepath.Join(d.dir, "config", "jupyter_server_config.py"), []byte("c.Gpumem.serve_args = " + serveArgs + "\n")},
		{filepath.Join(d.dir, "lab-settings", "@jupyterlab", "apputils-extension", "notification.jupyterlab-settings"), []byte(`{"fetchNews": "false"}` + "\n")},
	}
	if d.simulated {
		files = append(files, demoFile{d.gpuFile(), []byte(demoGPUFile + "\n")},
			demoFile{filepath.Join(d.dir, "ipython", "profile_default", "startup", "00-gpumem-demo-gpu.py"), examples.SimulatedGPUStartup})
	}
	if err := os.MkdirAll(d.runtimeDir(), 0o700); err != nil {
		return fmt.Errorf("the demo's runtime dir: %w", err)
	}
	// A runtime dir made before (--dir again) may be wider: Jupyter wants 0700.
	if err := os.Chmod(d.runtimeDir(), 0o700); err != nil {
		return fmt.Errorf("the demo's runtime dir: %w", err)
	}
	for _, f := range files {
		if err := os.MkdirAll(filepath.Dir(f.path), 0o700); err != nil {
			return fmt.Errorf("the demo's dir: %w", err)
		}
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return fmt.Errorf("the demo's dir: %w", err)
		}
	}
	return nil
}

// demoFile is one file prepare writes.
type demoFile struct {
	path string
	data []byte
}

// labEnv is JupyterLab's environment: the demo's runtime and config dirs,
// and the simulated GPU, which the daemon its extension starts inherits.
func (d *demo) labEnv() []string {
	drop := map[string]bool{"JUPYTER_RUNTIME_DIR": true, "JUPYTER_CONFIG_DIR": true, "GPUMEM_SOCKET": true}
	if d.simulated {
		for _, k := range []string{"GPUMEM_FAKE_GPU", "IPYTHONDIR", "GPUMEM_DEMO_GPU", "GPUMEM_DEMO_BYTES", "GPUMEM_DEMO_NOTEBOOK"} {
			drop[k] = true
		}
	}
	var out []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !drop[k] {
			out = append(out, kv)
		}
	}
	out = append(out, "JUPYTER_RUNTIME_DIR="+d.runtimeDir(), "JUPYTER_CONFIG_DIR="+filepath.Join(d.dir, "config"))
	if d.simulated {
		out = append(out, "GPUMEM_FAKE_GPU="+d.gpuFile(), "IPYTHONDIR="+filepath.Join(d.dir, "ipython"),
			"GPUMEM_DEMO_GPU="+d.gpuFile(), "GPUMEM_DEMO_BYTES="+strconv.Itoa(demoHeld), "GPUMEM_DEMO_NOTEBOOK="+demoNotebook)
	}
	return out
}

// labArgs is JupyterLab's command line.
func (d *demo) labArgs() []string {
	args := []string{"--no-browser", "--ip=127.0.0.1", "--port=" + strconv.Itoa(d.port),
		"--IdentityProvider.token=" + d.token, "--ServerApp.root_dir=" + filepath.Join(d.dir, "notebooks"),
		"--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
		"--LabApp.user_settings_dir=" + filepath.Join(d.dir, "lab-settings"),
		"--LabApp.workspaces_dir=" + filepath.Join(d.dir, "lab-workspaces")}
	if os.Geteuid() == 0 {
		args = append(args, "--allow-root")
	}
	return args
}

// start runs JupyterLab in a process group of its own: Ctrl-C reaches the
// demo, which stops JupyterLab in order (its kernels, then its daemon).
func (d *demo) start() error {
	log, err := os.OpenFile(d.logFile(), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("JupyterLab's log: %w", err)
	}
	defer log.Close()
	d.cmd = exec.Command(d.lab, d.labArgs()...)
	d.cmd.Env, d.cmd.Dir = d.labEnv(), d.dir
	d.cmd.Stdout, d.cmd.Stderr = log, log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", d.lab, err)
	}
	d.exited = make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(d.exited) }()
	return nil
}

// stop ends JupyterLab: SIGTERM to its group (it shuts its kernels down and
// stops the daemon it started), SIGKILL after demoStopWait.
func (d *demo) stop() error {
	if d.cmd == nil || d.cmd.Process == nil {
		return nil
	}
	pgid := d.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(demoStopWait):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-d.exited
		return fmt.Errorf("JupyterLab did not stop within %s of SIGTERM: killed; see %s", units.Duration(demoStopWait), d.logFile())
	}
	// The daemon leaves after JupyterLab, once it has ended what the
	// kernels left: its log and socket are in the demo's dir until then.
	// It is only waited for, never signalled: it has its own way out.
	deadline := time.Now().Add(demoStopWait)
	procs := discovery.NewProcFinder(d.env.procFS())
	for d.daemonPID > 0 && procs.Alive(d.daemonPID) {
		if time.Now().After(deadline) {
			return fmt.Errorf("gpumem serve (pid %d) did not leave within %s of JupyterLab: see %s", d.daemonPID,
				units.Duration(demoStopWait), filepath.Join(d.runtimeDir(), "gpumem-serve.log"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// ready waits for JupyterLab, the daemon its extension starts and the
// example's kernel, then prints where everything is.
func (d *demo) ready(ctx context.Context) error {
	if err := d.waitFor(ctx, demoServerWait, "JupyterLab to write its server file", d.readServerFile); err != nil {
		return err
	}
	var state struct {
		Daemon struct {
			Case string `json:"case"`
			Text string `json:"text"`
			PID  int    `json:"pid"`
		} `json:"daemon"`
	}
	err := d.waitFor(ctx, demoDaemonWait, "JupyterLab's gpumem extension to start gpumem serve", func() error {
		if err := d.call(ctx, http.MethodGet, "gpumem/api/v1/state", nil, &state); err != nil {
			return err
		}
		if c := state.Daemon.Case; c != "started" && c != "shared" {
			return fmt.Errorf("the extension says: %s", state.Daemon.Text)
		}
		if state.Daemon.Case == "started" {
			d.daemonPID = state.Daemon.PID
		}
		return nil
	})
	if err != nil {
		return err
	}
	var sess struct {
		Kernel struct {
			ID string `json:"id"`
		} `json:"kernel"`
	}
	body := map[string]any{"path": demoNotebook, "type": "notebook", "name": demoNotebook, "kernel": map[string]string{"name": "python3"}}
	if err := d.call(ctx, http.MethodPost, "api/sessions", body, &sess); err != nil {
		return fmt.Errorf("opening a kernel for %s: %w; see %s", demoNotebook, err, d.logFile())
	}
	c := api.NewClient(demoSocket(d.dir))
	defer c.Close()
	var rep attribution.Report
	err = d.waitFor(ctx, demoKernelWait, "gpumem serve to follow the example's kernel", func() error {
		var err error
		if rep, err = c.Notebooks(ctx); err != nil {
			return err
		}
		return demoKernelFollowed(rep, sess.Kernel.ID, d.simulated)
	})
	if err != nil {
		return err
	}
	d.banner(rep)
	return nil
}

// demoKernelFollowed is nil once rep lists kernel id with its process (and,
// on the simulated GPU, the bytes its start-up file claims).
func demoKernelFollowed(rep attribution.Report, id string, simulated bool) error {
	for _, nb := range rep.Notebooks {
		if nb.KernelID != id {
			continue
		}
		switch {
		case len(nb.PIDs) == 0:
			return fmt.Errorf("kernel %s is listed without its process yet", id)
		case simulated && nb.GPUMemoryBytes == 0:
			return fmt.Errorf("kernel %s holds nothing on the simulated GPU yet", id)
		}
		return nil
	}
	return fmt.Errorf("kernel %s is not in the daemon's report yet", id)
}

func (d *demo) banner(rep attribution.Report) {
	w := d.env.Stdout
	where := "the real GPU"
	if d.simulated {
		where = "a simulated GPU (no NVIDIA driver here)"
	}
	fmt.Fprintf(w, "gpumem demo: JupyterLab with gpumem, on %s\n\n", where)
	_ = writeLs(w, rep, tableWidth)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "JupyterLab:    %slab/tree/%s?token=%s\n", d.url, demoNotebook, d.token)
	fmt.Fprintln(w, "               (status bar: the notebook's GPU memory; right sidebar: the \"GPU memory\" panel)")
	if d.simulated {
		fmt.Fprintf(w, "Simulated GPU: the example's kernel holds %s of it, after a restart too; edit %s to change the figures\n",
			units.Bytes(demoHeld), d.gpuFile())
	}
	if d.metrics != "" {
		fmt.Fprintf(w, "Metrics:       http://%s/metrics\n", d.metrics)
	}
	fmt.Fprintf(w, "gpumem serve:  started by JupyterLab's extension; its log: %s\n", filepath.Join(d.runtimeDir(), "gpumem-serve.log"))
	fmt.Fprintf(w, "In a shell:    JUPYTER_RUNTIME_DIR=%s gpumem ls --watch\n", d.runtimeDir())
	fmt.Fprintln(w, "Stop:          Ctrl-C")
}

// readServerFile reads JupyterLab's jpserver-<pid>.json for its URL (the
// port it took).
func (d *demo) readServerFile() error {
	data, err := os.ReadFile(filepath.Join(d.runtimeDir(), fmt.Sprintf("jpserver-%d.json", d.cmd.Process.Pid)))
	if err != nil {
		return err
	}
	var info struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(data, &info); err != nil || info.URL == "" {
		return fmt.Errorf("its server file is not written yet")
	}
	d.url = strings.TrimSuffix(info.URL, "/") + "/"
	return nil
}

// call sends one request to JupyterLab with the demo's token.
func (d *demo) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, d.url+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "token "+d.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && strings.HasPrefix(path, "gpumem/"):
		return errors.New("this JupyterLab has no gpumem server extension (pip install jupyterlab-gpumem into its environment)")
	case resp.StatusCode/100 != 2:
		return fmt.Errorf("JupyterLab answered %s to %s", resp.Status, path)
	}
	return json.Unmarshal(data, out)
}

// waitFor polls cond every 200 ms until it returns nil, JupyterLab exits,
// ctx ends or timeout passes; the error then names what was awaited and
// cond's last word.
func (d *demo) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() error) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted while waiting for %s", what)
		case <-d.exited:
			return fmt.Errorf("JupyterLab exited (%s) while gpumem demo waited for %s: see %s", d.cmd.ProcessState, what, d.logFile())
		case <-deadline.C:
			return fmt.Errorf("waited %s for %s (%v): see %s and %s", units.Duration(timeout), what, err,
				d.logFile(), filepath.Join(d.runtimeDir(), "gpumem-serve.log"))
		case <-tick.C:
		}
	}
}
