package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// Kernels that no Jupyter server started write their connection files
// where their client chose: jupyter_client's temp files (/tmp/tmpXXXX.json)
// for nbclient, papermill and a KernelManager in a script. gpumem kernels
// finds them through /proc (argv), names the notebook where the client
// exposes it (papermill's input path; nbclient and KernelManager expose
// none), and gpumem attach accepts their connection files.

// jobNotebook is a one-cell notebook whose cell writes the kernel's pid to
// $GPUMEM_TEST_READY and runs until $GPUMEM_TEST_STOP exists: a job caught
// while it runs.
const jobNotebook = `{"cells":[{"cell_type":"code","id":"c1","metadata":{},"execution_count":null,"outputs":[],
"source":["import os, time, pathlib\n","pathlib.Path(os.environ['GPUMEM_TEST_READY'] + '.tmp').write_text(str(os.getpid()))\n",
"os.rename(os.environ['GPUMEM_TEST_READY'] + '.tmp', os.environ['GPUMEM_TEST_READY'])\n",
"while not os.path.exists(os.environ['GPUMEM_TEST_STOP']):\n","    time.sleep(0.05)\n"]}],
"metadata":{"kernelspec":{"name":"python3","display_name":"Python 3","language":"python"}},"nbformat":4,"nbformat_minor":5}`

// nbclientRun executes a notebook with nbclient, as scripts and CI jobs do.
const nbclientRun = `import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3").execute()
`

// kernelManagerRun starts a kernel with KernelManager, prints its
// connection file and keeps it until the process is killed.
const kernelManagerRun = `import signal
from jupyter_client import KernelManager
km = KernelManager(kernel_name="python3")
km.start_kernel()
print(km.connection_file, flush=True)
signal.pause()
`

func TestKernelsWithoutServer(t *testing.T) {
	t.Parallel()
	type runner struct {
		name     string
		argv     func(dir, nb string) []string
		notebook func(dir, nb string) string // what gpumem should name
	}
	runners := []runner{}
	if testenv.CurrentStack() == testenv.Current { // papermill and nbclient are parts of the current stack only
		runners = append(runners,
			runner{"papermill", func(dir, nb string) []string {
				// Relative paths, as people type them: the input is made
				// absolute against papermill's cwd.
				return []string{filepath.Join(testenv.BinDir(), "papermill"), "-k", "python3", "job.ipynb", "out.ipynb"}
			}, func(dir, nb string) string { return nb }},
			runner{"nbclient", func(dir, nb string) []string {
				return []string{testenv.Python(), "-c", nbclientRun, nb}
			}, func(string, string) string { return "" }},
		)
	}
	for _, r := range runners {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			testenv.Require(t, "ipykernel", "jupyter_client", r.name)
			dir := t.TempDir()
			nb := filepath.Join(dir, "job.ipynb")
			if err := os.WriteFile(nb, []byte(jobNotebook), 0o600); err != nil {
				t.Fatal(err)
			}
			ready, stop := filepath.Join(dir, "ready"), filepath.Join(dir, "stop")
			p := testenv.Start(t, testenv.Env(dir, "GPUMEM_TEST_READY="+ready, "GPUMEM_TEST_STOP="+stop), dir, r.argv(dir, nb)...)
			var pid int
			testenv.Poll(t, 90*time.Second, r.name+"'s kernel to run the cell", func() bool {
				if p.Exited() {
					t.Fatalf("%s exited:\n%s", r.name, p.Output())
				}
				b, err := os.ReadFile(ready)
				if err != nil {
					return false
				}
				pid, err = strconv.Atoi(string(b))
				return err == nil
			})
			testenv.NewReaper(t, nil).Add(pid) // jupyter_client starts kernels in their own session
			res := runGpumem(t, gpumemEnv(dir), "kernels", "--json")
			if res.Code != 0 {
				t.Fatalf("gpumem kernels: want exit 0\n%s", res)
			}
			var found *kernelJSON
			for _, k := range decodeKernels(t, res) {
				if k.PID == pid {
					found = &k
				}
			}
			if found == nil {
				t.Fatalf("the %s kernel (pid %d) is not listed\n%s", r.name, pid, res)
			}
			if strings.HasPrefix(found.ConnectionFile, filepath.Join(dir, "runtime")) || !strings.HasSuffix(found.ConnectionFile, ".json") {
				t.Errorf("connection file %q: want one outside the runtime dir", found.ConnectionFile)
			}
			if want := r.notebook(dir, nb); found.Notebook != want {
				t.Errorf("notebook %q, want %q", found.Notebook, want)
			}
			if err := os.WriteFile(stop, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			testenv.Poll(t, 60*time.Second, r.name+" to finish", p.Exited)
		})
	}

	t.Run("KernelManager", func(t *testing.T) {
		t.Parallel()
		testenv.Require(t, "ipykernel", "jupyter_client")
		dir := t.TempDir()
		p := testenv.Start(t, testenv.Env(dir), dir, testenv.Python(), "-c", kernelManagerRun)
		var cf string
		testenv.Poll(t, 60*time.Second, "KernelManager's connection file", func() bool {
			if p.Exited() {
				t.Fatalf("KernelManager script exited:\n%s", p.Output())
			}
			out := strings.TrimSpace(p.Output())
			for _, line := range strings.Split(out, "\n") {
				if strings.HasSuffix(line, ".json") && filepath.IsAbs(line) {
					cf = line
					return true
				}
			}
			return false
		})
		if strings.HasPrefix(cf, filepath.Join(dir, "runtime")) {
			t.Fatalf("connection file %s is in the runtime dir: the test wants one elsewhere", cf)
		}
		pid := testenv.KernelPID(t, cf)
		testenv.NewReaper(t, nil).Add(pid) // jupyter_client starts kernels in their own session

		res := runGpumem(t, gpumemEnv(dir), "kernels", "--json")
		var found bool
		for _, k := range decodeKernels(t, res) {
			if k.ConnectionFile == cf {
				found = k.PID == pid && k.Alive
			}
		}
		if !found {
			t.Errorf("kernel %s (pid %d) not listed alive with its pid\n%s", cf, pid, res)
		}
		// ls names it by the GPU memory its process holds: a kernel
		// launched outside the runtime dir is ls's when its process tree
		// holds GPU memory (ls reads the GPU processes' lineage, not every
		// process's argv), and is not listed while it holds none.
		lsKernel := func(fake string) *lsNotebook {
			res := runGpumem(t, gpumemEnv(dir, "GPUMEM_FAKE_GPU="+fake), "ls", "--json")
			var rep lsReport
			if res.Code != 0 || json.Unmarshal([]byte(res.Stdout), &rep) != nil {
				t.Fatalf("gpumem ls --json: want exit 0 and JSON\n%s", res)
			}
			for _, nb := range rep.Notebooks {
				if nb.ConnectionFile == cf {
					return &nb
				}
			}
			return nil
		}
		const held = 3_000_000_017
		holding := testenv.SimulatedGPUFile(t, testenv.SimGPU{Name: "Simulated H100", UUID: "GPU-launched", MemoryTotalBytes: 80 << 30,
			Processes: []testenv.FakeProc{{PID: pid, UsedBytes: held}}})
		if nb := lsKernel(holding); nb == nil || nb.GPUMemoryBytes != held || !slices.Equal(nb.PIDs, []int{pid}) {
			t.Errorf("gpumem ls with the kernel (pid %d) holding %d bytes: %+v, want it listed with them", pid, held, nb)
		}
		none := testenv.SimulatedGPUFile(t, testenv.SimGPU{Name: "Simulated H100", UUID: "GPU-launched", MemoryTotalBytes: 80 << 30})
		if nb := lsKernel(none); nb != nil {
			t.Errorf("gpumem ls with no GPU process: the launched kernel is listed: %+v", nb)
		}

		// Another Jupyter environment (another runtime dir: another user, or
		// another test) does not see it.
		res = runGpumem(t, gpumemEnv(t.TempDir()), "kernels", "--json")
		for _, k := range decodeKernels(t, res) {
			if k.ConnectionFile == cf || k.PID == pid {
				t.Errorf("kernel %s listed by gpumem in another runtime dir\n%s", cf, res)
			}
		}

		res = runGpumem(t, gpumemEnv(dir), "attach", cf)
		if res.Code != 0 || !strings.Contains(res.Stdout, "inject") {
			t.Fatalf("gpumem attach %s: want exit 0 and the injection said\n%s", cf, res)
		}
		r := testenv.RunCell(t, cf, "%gpumem help", 60*time.Second)
		if r.Status != "ok" {
			t.Fatalf("%%gpumem help after attach: %+v", r)
		}

		// A connection file that names no live kernel is an error naming it,
		// and quick.
		stale := filepath.Join(dir, "tmpstale.json")
		b, err := os.ReadFile(cf)
		if err != nil {
			t.Fatal(err)
		}
		var conn map[string]any
		if err := json.Unmarshal(b, &conn); err != nil {
			t.Fatal(err)
		}
		for _, port := range []string{"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"} {
			conn[port] = testenv.FreePort(t)
		}
		b, _ = json.Marshal(conn)
		if err := os.WriteFile(stale, b, 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		res = runGpumem(t, gpumemEnv(dir), "attach", "--timeout=20s", stale)
		if res.Code == 0 || !strings.Contains(res.Stderr, stale) {
			t.Errorf("gpumem attach %s (no kernel behind it): want an error naming the file\n%s", stale, res)
		}
		t.Logf("attach to a dead connection file failed after %v", time.Since(start))
	})
}
