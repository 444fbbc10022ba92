package daemon

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/syncutil"
	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// rig is a Daemon over a fixture /proc, a simulated GPU file, a finder
// that says which process serves each connection file, and a Terminate
// that records instead of signalling (fixture pids are not this machine's).
type rig struct {
	t        *testing.T
	d        *Daemon
	dir      string // runtime dir
	procRoot string
	gpuFile  string
	logs     *syncutil.Buffer
	ctx      context.Context

	mu     sync.Mutex
	owners map[string]discovery.Owner // by connection file
	killed []int
	procs  map[int]procstest.Proc
	// sm is the SM percentage setGPU gives a pid (none: 0); noUtil plays
	// a GPU that cannot say.
	sm     map[int]uint32
	noUtil bool
}

// FindKernels implements discovery.ProcessFinder with the rig's owners.
func (r *rig) FindKernels(files []discovery.KernelFile) (map[string]discovery.Owner, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]discovery.Owner{}
	for _, f := range files {
		if o, ok := r.owners[f.Path]; ok {
			out[f.Path] = o
		}
	}
	return out, nil
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	base := t.TempDir()
	r := &rig{t: t, dir: filepath.Join(base, "runtime"), procRoot: filepath.Join(base, "proc"),
		gpuFile: filepath.Join(base, "gpus.json"), logs: &syncutil.Buffer{},
		owners: map[string]discovery.Owner{}, procs: map[int]procstest.Proc{}, sm: map[int]uint32{}}
	for _, d := range []string{r.dir, r.procRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	r.setProcs(procstest.Proc{PID: 1, PPID: 0, PGID: 1, SID: 1, Start: 1, Comm: "init", Argv: []string{"/sbin/init"}})
	r.setGPU()
	gpus, err := nvml.OpenSimulated(r.gpuFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gpus.Close() })
	cfg.RuntimeDirs = []string{r.dir}
	// Reclaim watches a dead kernel's survivors for the grace window
	// before it decides: short here, where samples are the test's.
	if cfg.ReclaimGrace == 0 {
		cfg.ReclaimGrace = 100 * time.Millisecond
	}
	if cfg.Interval == 0 {
		cfg.Interval = 20 * time.Millisecond
	}
	if cfg.SocketPath == "" {
		cfg.SocketPath = filepath.Join(r.dir, "gpumem.sock")
	}
	r.d, err = New(cfg, Deps{GPUs: gpus, Procs: &procs.FS{Root: r.procRoot}, Finder: r,
		Terminate: func(_ context.Context, pid int, _ uint64, _ time.Duration) (bool, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.killed = append(r.killed, pid)
			return false, nil
		}}, zerolog.New(r.logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.ctx = ctx
	t.Cleanup(func() { cancel(); r.d.wg.Wait() })
	return r
}

// setProcs writes (or rewrites) fixture processes.
func (r *rig) setProcs(ps ...procstest.Proc) {
	r.t.Helper()
	for _, p := range ps {
		if p.Start == 0 {
			p.Start = uint64(p.PID)
		}
		if p.UID == 0 {
			p.UID = uint32(os.Geteuid())
		}
		if err := os.RemoveAll(filepath.Join(r.procRoot, strconv.Itoa(p.PID))); err != nil {
			r.t.Fatal(err)
		}
		procstest.WriteTree(r.t, r.procRoot, []procstest.Proc{p})
		r.procs[p.PID] = p
	}
}

// exit removes processes from the fixture /proc.
func (r *rig) exit(pids ...int) {
	r.t.Helper()
	for _, pid := range pids {
		if err := os.RemoveAll(filepath.Join(r.procRoot, strconv.Itoa(pid))); err != nil {
			r.t.Fatal(err)
		}
		delete(r.procs, pid)
	}
}

// setGPU lists pid → bytes on one simulated 80 GiB GPU.
func (r *rig) setGPU(pidBytes ...uint64) {
	r.t.Helper()
	gpu := testenv.SimGPU{Name: "Simulated H200", UUID: "GPU-0", MemoryTotalBytes: 80 << 30}
	r.mu.Lock()
	for i := 0; i+1 < len(pidBytes); i += 2 {
		gpu.Processes = append(gpu.Processes, testenv.FakeProc{PID: int(pidBytes[i]), UsedBytes: pidBytes[i+1], SMPercent: r.sm[int(pidBytes[i])]})
	}
	gpu.UtilizationUnknown = r.noUtil
	r.mu.Unlock()
	testenv.WriteSimulatedGPUs(r.t, r.gpuFile, gpu)
}

// kernelFile writes kernel-<id>.json (on ports nothing listens on: the
// daemon's attach retries harmlessly) and says which process serves it.
func (r *rig) kernelFile(id string, owner discovery.Owner) string {
	r.t.Helper()
	path := filepath.Join(r.dir, "kernel-"+id+".json")
	conn := `{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`
	if err := os.WriteFile(path, []byte(conn), 0o600); err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.owners[path] = owner
	r.mu.Unlock()
	return path
}

func (r *rig) kills() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.killed...)
}

// waitLog polls the daemon's log for a line holding every part.
func (r *rig) waitLog(parts ...string) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, line := range strings.Split(r.logs.String(), "\n") {
			ok := line != ""
			for _, p := range parts {
				ok = ok && strings.Contains(line, p)
			}
			if ok {
				return
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no log line with %q in:\n%s", parts, r.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *rig) kernel(connFile string) *kernelState {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	return r.d.kernels[connFile]
}

func (r *rig) report() map[string][]int {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	out := map[string][]int{}
	for _, nb := range r.d.pub.last.Report.Notebooks {
		out[nb.KernelID] = nb.PIDs
	}
	return out
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
}
