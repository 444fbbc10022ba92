// Package bench breaks the wall time of `gpumem kernels --json` and
// `gpumem ls --json` with 20 live kernels (tests.BenchmarkCLI20Kernels) into
// the phases the CLI runs, calling the same packages in-process against the
// same real fixture: a Notebook 6 server with 20 sessions. It is a profiling
// aid, kept apart from the end-to-end scenarios in tests/ because it calls
// internal APIs that may change.
//
//	go test ./tests/bench/ -run '^$' -bench Phases -benchtime 30x
package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/cmd/gpumem/cli"
	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/nvml/driver"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
)

func BenchmarkPhases20Kernels(b *testing.B) {
	const kernels = 20
	srv := testenv.StartServer(b, testenv.NotebookServer())
	var ids []string
	for i := range kernels {
		ids = append(ids, srv.CreateSession(b, fmt.Sprintf("bench/nb%02d.ipynb", i)).Kernel.ID)
	}
	for _, id := range ids {
		testenv.WaitKernelListening(b, srv.ConnectionFile(id), 2*time.Minute)
	}
	ctx := context.Background()
	opts := discovery.Options{RuntimeDirs: []string{srv.RuntimeDir()}, Procs: discovery.NewProcFinder(&procs.FS{})}
	var res discovery.Result
	testenv.Poll(b, 2*time.Minute, "20 kernels with pids", func() bool {
		res = discovery.Discover(ctx, opts)
		n := 0
		for _, k := range res.Kernels {
			if k.PID > 0 {
				n++
			}
		}
		return n == kernels && len(res.Problems) == 0
	})
	// The server's kernels are session leaders outside its group.
	reap := testenv.NewReaper(b, srv)
	for _, k := range res.Kernels {
		reap.Add(k.PID)
	}
	var shellPorts, kernelPIDs []int
	for _, k := range res.Kernels {
		shellPorts = append(shellPorts, k.Connection.ShellPort)
		kernelPIDs = append(kernelPIDs, k.PID)
	}
	fake := filepath.Join(b.TempDir(), "gpu.json")
	gpu := testenv.SimGPU{Name: "Simulated H100", MemoryTotalBytes: 80 << 30}
	for i, pid := range kernelPIDs {
		gpu.Processes = append(gpu.Processes, testenv.FakeProc{PID: pid, UsedBytes: 1<<30 + uint64(i)})
	}
	testenv.WriteSimulatedGPUs(b, fake, gpu)
	bin, err := testenv.GoBuild(b.TempDir(), "gpumem", "./cmd/gpumem", false)
	if err != nil {
		b.Fatal(err)
	}

	cliEnv := func(k string) string {
		switch k {
		case "JUPYTER_RUNTIME_DIR":
			return srv.RuntimeDir()
		case "JUPYTER_DATA_DIR":
			return filepath.Join(srv.Dir, "data")
		case "GPUMEM_FAKE_GPU":
			return fake
		}
		return ""
	}
	for _, args := range [][]string{{"kernels", "--json"}, {"ls", "--json"}} {
		args := args
		b.Run("exec_"+args[0]+"_json", func(b *testing.B) { // what the user waits for
			cmd := func() *exec.Cmd {
				c := exec.Command(bin, args...)
				c.Env = []string{"JUPYTER_RUNTIME_DIR=" + srv.RuntimeDir(), "JUPYTER_DATA_DIR=" + filepath.Join(srv.Dir, "data"), "GPUMEM_FAKE_GPU=" + fake}
				return c
			}
			for b.Loop() {
				if out, err := cmd().CombinedOutput(); err != nil {
					b.Fatalf("%v\n%s", err, out)
				}
			}
		})
		b.Run("inprocess_"+args[0]+"_json", func(b *testing.B) { // the same, without exec
			for b.Loop() {
				var stdout, stderr bytes.Buffer
				if code := cli.Run(ctx, args, cli.Env{Stdout: &stdout, Stderr: &stderr, Getenv: cliEnv}); code != 0 {
					b.Fatalf("exit %d: %s", code, stderr.String())
				}
			}
		})
	}
	b.Run("exec_version", func(b *testing.B) { // process start and exit, no work
		for b.Loop() {
			if err := exec.Command(bin, "version").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("discover", func(b *testing.B) { // runtime dir + HTTP sessions + pids
		for b.Loop() {
			discovery.Discover(ctx, opts)
		}
	})
	b.Run("discover_no_pids", func(b *testing.B) { // runtime dir + HTTP sessions
		o := opts
		o.Procs = nil
		for b.Loop() {
			discovery.Discover(ctx, o)
		}
	})
	b.Run("http_sessions", func(b *testing.B) {
		hc := &httpClient
		for b.Loop() {
			if _, err := res.Servers[0].Sessions(ctx, hc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proc_net_tcp", func(b *testing.B) {
		fs := &procs.FS{}
		for b.Loop() {
			if _, err := fs.ListeningTCPPorts(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("socket_owners_fd_scan", func(b *testing.B) {
		fs := &procs.FS{}
		ports, err := fs.ListeningTCPPorts()
		if err != nil {
			b.Fatal(err)
		}
		var inodes []uint64
		for _, p := range shellPorts {
			for _, l := range ports[p] {
				inodes = append(inodes, l.Inode)
			}
		}
		for b.Loop() {
			if _, err := fs.SocketOwners(inodes); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("find_kernels", func(b *testing.B) { // cmdlines + net/tcp + candidates' fds + ScanTree
		pf := discovery.NewProcFinder(&procs.FS{})
		var files []discovery.KernelFile
		for _, k := range res.Kernels {
			files = append(files, discovery.KernelFileOf(k))
		}
		for b.Loop() {
			if _, err := pf.FindKernels(files); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("scan_tree_fresh_fs", func(b *testing.B) { // as a CLI run: user cache empty
		for b.Loop() {
			fs := &procs.FS{}
			if _, err := fs.ScanTree(kernelPIDs); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ping20", func(b *testing.B) {
		for b.Loop() {
			var wg sync.WaitGroup
			for _, k := range res.Kernels {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pctx, cancel := context.WithTimeout(ctx, time.Second)
					defer cancel()
					if err := protocol.Ping(pctx, k.Connection); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
		}
	})
	b.Run("ping1", func(b *testing.B) {
		for b.Loop() {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			if err := protocol.Ping(pctx, res.Kernels[0].Connection); err != nil {
				b.Error(err)
			}
			cancel()
		}
	})
	b.Run("ls_sample_and_attribute", func(b *testing.B) { // what ls adds after discovery
		for b.Loop() {
			src, err := driver.Open(driver.Options{FakeGPUFile: fake})
			if err != nil {
				b.Fatal(err)
			}
			snap, err := src.Sample(ctx)
			if err != nil {
				b.Fatal(err)
			}
			var ks []attribution.Kernel
			for _, k := range res.Kernels {
				ks = append(ks, attribution.Kernel{ID: k.ID, Notebook: k.Notebook, PID: k.PID, StartTime: k.PIDStart})
			}
			fs := &procs.FS{}
			table, err := fs.ScanTree(attribution.DetailPIDs(snap, ks))
			if err != nil {
				b.Fatal(err)
			}
			attribution.Attribute(snap, table, ks)
			_ = src.Close()
		}
	})
}

var httpClient = http.Client{Timeout: 5 * time.Second}
