package driver

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Tests against the real driver run only where asked (a GPU host):
//
//	GPUMEM_TEST_REAL_NVML=1 [GPUMEM_TEST_GPU_PID=<pid holding GPU memory>] go test -run RealNVML ./nvml/driver
func requireRealNVML(tb testing.TB) {
	tb.Helper()
	if os.Getenv("GPUMEM_TEST_REAL_NVML") == "" {
		tb.Skip("set GPUMEM_TEST_REAL_NVML=1 on a host with an NVIDIA GPU")
	}
}

func TestRealNVML(t *testing.T) {
	requireRealNVML(t)
	start := time.Now()
	src, r := openLibrary(gonvml.New(), 0)
	defer src.Close()
	t.Logf("Open (Init + probes): %v", time.Since(start))
	if err := src.InitErr(); err != nil {
		t.Fatalf("no driver: %v", err)
	}
	t.Logf("probes: memory info v2 %v, MPS %v, MIG %v, process utilization %v; driver %s", r.memV2, r.mps, r.mig, r.procUtil, r.driverVersion)

	start = time.Now()
	snap, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Sample: %v", time.Since(start))
	if len(snap.Devices) == 0 {
		t.Fatal("no devices")
	}
	for _, w := range snap.Warnings {
		t.Logf("warning: %s", w)
	}
	for _, d := range snap.Devices {
		t.Logf("gpu %d %s %s: total %d used %d reserved %d MIG %v, %d processes",
			d.Index, d.UUID, d.Name, d.MemoryTotalBytes, d.MemoryUsedBytes, d.MemoryReservedBytes, d.MIGEnabled, len(d.Processes))
		if d.UtilizationMissing != "" {
			t.Logf("  per-process utilization unknown: %s", d.UtilizationMissing)
		}
		for _, p := range d.Processes {
			t.Logf("  pid %d used %d (known %v) gi %#x ci %#x; SM %d%% memory %d%% (known %v, at %d)", p.PID, p.UsedBytes, p.UsedKnown,
				p.GPUInstanceID, p.ComputeInstanceID, p.Util.SMPercent, p.Util.MemoryPercent, p.Util.Known, p.Util.SampledAt)
		}
		if d.MemoryTotalBytes == 0 || d.UUID == "" || d.Name == "" || d.DriverVersion == "" {
			t.Errorf("gpu %d: incomplete %+v", d.Index, d)
		}
		if r.memV2 && d.MemoryReservedBytes == 0 {
			t.Errorf("gpu %d: memory info v2 but no reserved memory", d.Index)
		}
	}

	// Per-pid figures must equal nvidia-smi's (MiB).
	smi, err := exec.Command("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Logf("nvidia-smi: %v (comparison skipped)", err)
	} else {
		t.Logf("nvidia-smi --query-compute-apps=pid,used_memory:\n%s", smi)
		ours := map[int]uint64{}
		for _, d := range snap.Devices {
			for _, p := range d.Processes {
				ours[p.PID] += p.UsedBytes
			}
		}
		for _, line := range strings.Split(string(bytes.TrimSpace(smi)), "\n") {
			f := strings.Split(line, ",")
			if len(f) != 2 {
				continue
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(f[0]))
			mib, _ := strconv.ParseUint(strings.TrimSpace(f[1]), 10, 64)
			if got := ours[pid] >> 20; got != mib {
				t.Errorf("pid %d: nvml %d MiB, nvidia-smi %d MiB", pid, got, mib)
			}
		}
	}

	if s := os.Getenv("GPUMEM_TEST_GPU_PID"); s != "" {
		want, _ := strconv.Atoi(s)
		var found bool
		for _, d := range snap.Devices {
			for _, p := range d.Processes {
				if p.PID == want {
					found = true
					if !p.UsedKnown || p.UsedBytes < 512<<20 {
						t.Errorf("pid %d: %+v, want ≥ 512 MiB known", want, p)
					}
				}
			}
		}
		if !found {
			t.Errorf("pid %d holds GPU memory but is not listed", want)
		}
	}
}

func BenchmarkRealSample(b *testing.B) {
	requireRealNVML(b)
	src, err := Open(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	ctx := context.Background()
	for b.Loop() {
		if _, err := src.Sample(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// What per-process utilization adds to a sample on the real driver: the
// same Sample with the query and without it (the probe turned off), in
// one run. The GPU host's script (scripts/gpuhost/util_check.py) runs it
// while a job computes.
func BenchmarkRealSampleUtilization(b *testing.B) {
	requireRealNVML(b)
	src, r := openLibrary(gonvml.New(), 0)
	defer src.Close()
	if err := src.InitErr(); err != nil {
		b.Fatalf("no driver: %v", err)
	}
	if !r.procUtil {
		b.Skip("the driver lacks nvmlDeviceGetProcessUtilization")
	}
	ctx := context.Background()
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("utilization=%v", on), func(b *testing.B) {
			r.procUtil = on
			for b.Loop() {
				if _, err := src.Sample(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	r.procUtil = true
	snap, err := src.Sample(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			b.Logf("gpu %d pid %d: SM %d%% memory %d%% (known %v%s)", d.Index, p.PID, p.Util.SMPercent, p.Util.MemoryPercent,
				p.Util.Known, map[bool]string{true: "", false: ": " + d.UtilizationMissing}[p.Util.Known])
		}
	}
}

// Where a standalone `gpumem ls`'s first sample spends its time: each NVML
// call real.device makes, timed the first time this process makes it and
// once more, after Init. (Measured on an H200: the per-process
// utilization query is most of the device's read, 2.7 of 3.7 ms, first
// call or not; run the calls at once and the read takes as long, NVML
// answering them one after the other.)
func TestRealNVMLCallCosts(t *testing.T) {
	requireRealNVML(t)
	start := time.Now()
	lib := gonvml.New()
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("nvml init: %v", ret)
	}
	initTook := time.Since(start)
	start = time.Now()
	h, ret := lib.DeviceGetHandleByIndex(0)
	if ret != gonvml.SUCCESS {
		t.Fatalf("device 0: %v", ret)
	}
	handleTook := time.Since(start)
	calls := []struct {
		name string
		call func() gonvml.Return
	}{
		{"uuid", func() gonvml.Return { _, r := h.GetUUID(); return r }},
		{"name", func() gonvml.Return { _, r := h.GetName(); return r }},
		{"memory_v2", func() gonvml.Return { _, r := h.GetMemoryInfo_v2(); return r }},
		{"mig_mode", func() gonvml.Return { _, _, r := h.GetMigMode(); return r }},
		{"compute", func() gonvml.Return { _, r := h.GetComputeRunningProcesses(); return r }},
		{"graphics", func() gonvml.Return { _, r := h.GetGraphicsRunningProcesses(); return r }},
		{"mps", func() gonvml.Return { _, r := h.GetMPSComputeRunningProcesses(); return r }},
		{"process_util", func() gonvml.Return { _, r := h.GetProcessUtilization(0); return r }},
	}
	var first, again []string
	var sum time.Duration
	for _, c := range calls {
		s := time.Now()
		r := c.call()
		d := time.Since(s)
		sum += d
		first = append(first, fmt.Sprintf("%s=%.2f(%d)", c.name, ms(d), int(r)))
	}
	for _, c := range calls {
		s := time.Now()
		c.call()
		again = append(again, fmt.Sprintf("%s=%.2f", c.name, ms(time.Since(s))))
	}
	t.Logf("nvml_costs init_ms=%.2f handle_ms=%.2f device_ms=%.2f first: %s", ms(initTook), ms(handleTook), ms(sum), strings.Join(first, " "))
	t.Logf("nvml_costs again: %s", strings.Join(again, " "))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
