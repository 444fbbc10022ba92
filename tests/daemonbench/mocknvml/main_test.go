// Package mocknvml is `gpumem serve` over go-nvml's mock of an 8-GPU
// H200 host instead of the simulated-GPU file: the daemon's cost with the
// product's NVML code path (nvml/driver), without the file's read. Built
// by BenchmarkHost (DAEMONBENCH_MOCK=1) as a test binary, `go test -c`, so
// that no package of the module but nvml/driver imports go-nvml; run with
// GPUMEM_MOCK_NVML=1 it is the daemon, its arguments gpumem's.
//
// The mock holds what GPUMEM_FAKE_GPU's file says when the daemon starts
// (the benchmark writes it before): each GPU's memory and processes. It
// says no process ran a kernel since the last reading (NOT_FOUND), as
// NVML does of idle processes.
package mocknvml

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpumem/gpumem/cmd/gpumem/cli"
	"github.com/gpumem/gpumem/nvml"
)

func TestMain(m *testing.M) {
	if os.Getenv("GPUMEM_MOCK_NVML") != "1" {
		os.Exit(m.Run()) // go test: no tests here
	}
	lib, err := mockOf(os.Getenv("GPUMEM_FAKE_GPU"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "mocknvml: %v\n", err)
		os.Exit(2)
	}
	getenv := func(k string) string {
		if k == "GPUMEM_FAKE_GPU" { // the mock replaces the file
			return ""
		}
		return os.Getenv(k)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: getenv, NVML: lib})
	stop()
	os.Exit(code)
}

// mockOf is the mock of the host the simulated-GPU file at path describes.
func mockOf(path string) (*server.Server, error) {
	src, err := nvml.OpenSimulated(path)
	if err != nil {
		return nil, err
	}
	snap, err := src.Sample(context.Background())
	src.Close()
	if err != nil {
		return nil, err
	}
	srv := dgxh200.New()
	if len(snap.Devices) != len(srv.Devices) {
		return nil, fmt.Errorf("%s: %d GPUs, the mock has %d", path, len(snap.Devices), len(srv.Devices))
	}
	for i, d := range srv.Devices {
		dev, sim := d.(*server.Device), snap.Devices[i]
		mem := gonvml.Memory_v2{Total: sim.MemoryTotalBytes, Used: sim.MemoryUsedBytes, Free: sim.MemoryTotalBytes - sim.MemoryUsedBytes}
		dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) { return mem, gonvml.SUCCESS }
		procs := make([]gonvml.ProcessInfo, 0, len(sim.Processes))
		for _, p := range sim.Processes {
			procs = append(procs, gonvml.ProcessInfo{Pid: uint32(p.PID), UsedGpuMemory: p.UsedBytes,
				GpuInstanceId: nvml.NoInstance, ComputeInstanceId: nvml.NoInstance})
		}
		dev.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return procs, gonvml.SUCCESS }
		none := func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.SUCCESS }
		dev.GetGraphicsRunningProcessesFunc, dev.GetMPSComputeRunningProcessesFunc = none, none
		dev.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
			return nil, gonvml.ERROR_NOT_FOUND
		}
	}
	return srv, nil
}
