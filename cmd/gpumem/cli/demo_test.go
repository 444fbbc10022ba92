package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/examples"
	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// The demo's first simulated-GPU file is the simulated-GPU writer's
// document of the same device, byte for byte, and nvml reads it as that
// device with no process.
func TestDemoGPUFileIsTheWritersDocument(t *testing.T) {
	want := testenv.SimulatedGPUs(testenv.SimGPU{Name: "Simulated H200", UUID: "GPU-simulated-0", MemoryTotalBytes: 150754820096})
	if !bytes.Equal([]byte(demoGPUFile), want) {
		t.Errorf("the demo writes\n%s\nthe writer, for its device:\n%s", demoGPUFile, want)
	}
	path := filepath.Join(t.TempDir(), "gpus.json")
	if err := os.WriteFile(path, []byte(demoGPUFile), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := nvml.OpenSimulated(path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	snap, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Devices) != 1 || snap.Devices[0].Name != "Simulated H200" || len(snap.Devices[0].Processes) != 0 {
		t.Errorf("nvml reads the demo's GPU as %+v", snap.Devices)
	}
}

// prepare writes the notebook, the daemon's settings and, on a simulated
// GPU only, the GPU file and the kernels' start-up file; the runtime dir is
// Jupyter's 0700 even where --dir held a wider one.
func TestDemoPrepare(t *testing.T) {
	for _, tc := range []struct {
		name      string
		simulated bool
		metrics   string
		serveArgs string
	}{
		{"real GPU", false, "", "c.Gpumem.serve_args = []\n"},
		{"simulated, metrics", true, "127.0.0.1:9464", "c.Gpumem.serve_args = [\"--listen=127.0.0.1:9464\"]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "runtime"), 0o755); err != nil {
				t.Fatal(err)
			}
			d := &demo{dir: dir, simulated: tc.simulated, metrics: tc.metrics}
			if err := d.prepare(); err != nil {
				t.Fatal(err)
			}
			if len(d.token) != 48 {
				t.Errorf("token %q: want 48 hex digits", d.token)
			}
			if fi, err := os.Stat(d.runtimeDir()); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("runtime dir: %v, %v; want mode 0700", fi.Mode(), err)
			}
			read := func(rel ...string) string {
				b, _ := os.ReadFile(filepath.Join(append([]string{dir}, rel...)...))
				return string(b)
			}
			if read("notebooks", demoNotebook) != string(examples.LeaksNotebook) {
				t.Error("the notebook is not the example")
			}
			if got := read("config", "jupyter_server_config.py"); got != tc.serveArgs {
				t.Errorf("config %q, want %q", got, tc.serveArgs)
			}
			startup := read("ipython", "profile_default", "startup", "00-gpumem-demo-gpu.py")
			gpu := read("gpus.json")
			if tc.simulated != (startup == string(examples.SimulatedGPUStartup)) || tc.simulated != (gpu == demoGPUFile+"\n") {
				t.Errorf("simulated %v: start-up file %d bytes, GPU file %q", tc.simulated, len(startup), gpu)
			}
			env := strings.Join(d.labEnv(), "\n")
			if !strings.Contains(env, "JUPYTER_RUNTIME_DIR="+d.runtimeDir()) || tc.simulated != strings.Contains(env, "GPUMEM_FAKE_GPU="+d.gpuFile()) {
				t.Errorf("JupyterLab's environment lacks the demo's dirs or GPU:\n%s", env)
			}
		})
	}
}

// The demo is ready once the daemon lists the kernel with its process and,
// on a simulated GPU, the bytes the kernel claimed.
func TestDemoKernelFollowed(t *testing.T) {
	nb := func(id string, pids []int, bytes uint64) attribution.Report {
		return attribution.Report{Notebooks: []attribution.Notebook{{KernelID: id, PIDs: pids, GPUMemoryBytes: bytes}}}
	}
	for _, tc := range []struct {
		name      string
		rep       attribution.Report
		simulated bool
		want      string // "" ready, else a word of the error
	}{
		{"not listed", nb("other", []int{1}, 1), true, "not in the daemon's report"},
		{"no process", nb("k", nil, 0), false, "without its process"},
		{"real GPU, nothing held", nb("k", []int{7}, 0), false, ""},
		{"simulated, nothing held", nb("k", []int{7}, 0), true, "holds nothing"},
		{"simulated, held", nb("k", []int{7}, 3<<30), true, ""},
	} {
		err := demoKernelFollowed(tc.rep, "k", tc.simulated)
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// Mistakes are refused before anything starts (a stray argument:
// TestStrayArgumentRefused).
func TestDemoArgs(t *testing.T) {
	for _, args := range [][]string{{"--port=0"}, {"--port=70000"}, {"--prot=1"}} {
		var stderr bytes.Buffer
		if code := Run(context.Background(), append([]string{"demo"}, args...), Env{Stdout: &bytes.Buffer{}, Stderr: &stderr}); code != 2 {
			t.Errorf("gpumem demo %v: exit %d (%s), want 2", args, code, stderr.String())
		}
	}
}

// A $TMPDIR so deep that the daemon's socket would not fit a unix socket's
// path puts the demo under /tmp; a --dir that deep is refused, naming it,
// before anything starts.
func TestDemoDirFitsTheSocket(t *testing.T) {
	deep := t.TempDir()
	for len(deep) < api.MaxSocketPath {
		deep = filepath.Join(deep, "a-long-directory-name")
	}
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", deep)
	dir, err := demoTempDir()
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if n := len(demoSocket(dir)); n > api.MaxSocketPath || !strings.HasPrefix(dir, "/tmp/gpumem-demo-") {
		t.Errorf("demo dir %s: socket path %d bytes, want at most %d, under /tmp", dir, n, api.MaxSocketPath)
	}
	if left, _ := os.ReadDir(deep); len(left) != 0 {
		t.Errorf("made in the deep TMPDIR: %v", left)
	}
	// A TMPDIR where it fits is used.
	t.Setenv("TMPDIR", t.TempDir())
	near, err := demoTempDir()
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(near)
	if filepath.Dir(near) != os.Getenv("TMPDIR") {
		t.Errorf("demo dir %s, want it in TMPDIR %s", near, os.Getenv("TMPDIR"))
	}
	code, out, errs := runCLI("demo", "--dir", deep)
	if code != 2 || out != "" || !strings.Contains(errs, "--dir "+deep) || !strings.Contains(errs, "choose a shorter dir") {
		t.Errorf("demo --dir (too deep): exit %d, stdout %q, stderr %q", code, out, errs)
	}
}
