package driver

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpumem/gpumem/nvml"
)

const gib = 1 << 30

// h100 returns go-nvml's canned 8-GPU DGX H100 with empty process lists and
// memory info v2 on every device; tests then override what they need.
func h100(t testing.TB) (*server.Server, []*server.Device) {
	t.Helper()
	srv := dgxh100.New()
	devs := make([]*server.Device, len(srv.Devices))
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		devs[i] = dev
		dev.MemoryInfo = gonvml.Memory{Total: 80 * gib, Used: 3 * gib, Free: 77 * gib}
		dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
			return gonvml.Memory_v2{Total: 80 * gib, Reserved: gib / 2, Used: 2 * gib, Free: 80*gib - 2*gib - gib/2}, gonvml.SUCCESS
		}
		setProcesses(dev, nil, nil, nil)
	}
	return srv, devs
}

// setProcesses sets a device's process lists; its per-process utilization
// says that none ran a kernel (NOT_FOUND, as NVML answers then).
func setProcesses(dev *server.Device, compute, graphics, mps []gonvml.ProcessInfo) {
	dev.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return compute, gonvml.SUCCESS }
	dev.GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return graphics, gonvml.SUCCESS }
	dev.GetMPSComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return mps, gonvml.SUCCESS }
	dev.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		return nil, gonvml.ERROR_NOT_FOUND
	}
}

func info(pid uint32, used uint64) gonvml.ProcessInfo {
	return gonvml.ProcessInfo{Pid: pid, UsedGpuMemory: used, GpuInstanceId: nvml.NoInstance, ComputeInstanceId: nvml.NoInstance}
}

func open(t testing.TB, opts Options) *nvml.Source {
	t.Helper()
	src, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

func sample(t *testing.T, src *nvml.Source) nvml.Snapshot {
	t.Helper()
	snap, err := src.Sample(context.Background())
	if err != nil {
		t.Fatalf("Sample: %v", err)
	}
	return snap
}

// After a failed Init, NVML must not be called again: go-nvml's mocks panic on
// any method whose func is unset, so only Init is set here.
func TestInitFailureMakesNoOtherCall(t *testing.T) {
	for _, ret := range []gonvml.Return{gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_DRIVER_NOT_LOADED,
		gonvml.ERROR_NO_PERMISSION, gonvml.ERROR_LIB_RM_VERSION_MISMATCH, gonvml.ERROR_UNKNOWN} {
		t.Run(ret.String(), func(t *testing.T) {
			lib := &mock.Interface{InitFunc: func() gonvml.Return { return ret }}
			src, err := Open(Options{Library: lib})
			if err != nil {
				t.Fatalf("Open: %v (a missing driver must not be an error)", err)
			}
			for range 2 {
				snap := sample(t, src)
				if len(snap.Devices) != 0 || snap.Devices == nil {
					t.Errorf("Devices = %#v, want empty", snap.Devices)
				}
				if !reflect.DeepEqual(snap.Warnings, []string{nvml.NoDriverWarning}) {
					t.Errorf("Warnings = %q, want [%q]", snap.Warnings, nvml.NoDriverWarning)
				}
			}
			if !errors.Is(src.InitErr(), ret) {
				t.Errorf("InitErr() = %v, want errors.Is %v", src.InitErr(), ret)
			}
			if err := src.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if n := len(lib.InitCalls()); n != 1 {
				t.Errorf("Init called %d times, want 1", n)
			}
		})
	}
}

// The real go-nvml with no library to load: the process must survive
// Open, Sample, InitErr's text and Close (any NVML call here would abort it).
func TestRealLibraryMissing(t *testing.T) {
	lib := gonvml.New(gonvml.WithLibraryPath(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")))
	src := open(t, Options{Library: lib})
	snap := sample(t, src)
	if len(snap.Devices) != 0 || !reflect.DeepEqual(snap.Warnings, []string{nvml.NoDriverWarning}) {
		t.Errorf("snapshot = %+v, want no devices and the no-driver warning", snap)
	}
	if !errors.Is(src.InitErr(), gonvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Errorf("InitErr() = %v, want ERROR_LIBRARY_NOT_FOUND", src.InitErr())
	}
	if !strings.Contains(src.InitErr().Error(), "libnvidia-ml.so.1 not found") {
		t.Errorf("InitErr() text = %q", src.InitErr().Error())
	}
}

func TestSampleDGXH100(t *testing.T) {
	srv, devs := h100(t)
	setProcesses(devs[0], []gonvml.ProcessInfo{info(4242, 2*gib), info(17, gib)}, nil, nil)
	setProcesses(devs[3], []gonvml.ProcessInfo{info(5000, 512<<20)}, nil, nil)
	src := open(t, Options{Library: srv})
	snap := sample(t, src)

	if snap.Simulated || len(snap.Warnings) != 0 {
		t.Errorf("Simulated = %v, Warnings = %q", snap.Simulated, snap.Warnings)
	}
	if len(snap.Devices) != 8 {
		t.Fatalf("got %d devices, want 8", len(snap.Devices))
	}
	d0 := snap.Devices[0]
	want := nvml.Device{
		Index: 0, UUID: devs[0].UUID, Name: "NVIDIA H100 80GB HBM3",
		MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 2 * gib, MemoryReservedBytes: gib / 2,
		DriverVersion: "550.54.15",
		Processes:     []nvml.Process{known(17, gib), known(4242, 2*gib)},
	}
	if !reflect.DeepEqual(d0, want) {
		t.Errorf("device 0:\n got %+v\nwant %+v", d0, want)
	}
	for i, d := range snap.Devices {
		if d.Index != i || d.UUID != devs[i].UUID {
			t.Errorf("device %d: index %d uuid %q, want %q", i, d.Index, d.UUID, devs[i].UUID)
		}
	}
	if got := snap.Devices[3].Processes; len(got) != 1 || got[0].PID != 5000 {
		t.Errorf("device 3 processes = %+v", got)
	}
	if got := snap.Devices[1].Processes; got == nil || len(got) != 0 {
		t.Errorf("device 1 processes = %#v, want empty", got)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(srv.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
	if _, err := src.Sample(context.Background()); !errors.Is(err, nvml.ErrClosed) {
		t.Errorf("Sample after Close: %v, want ErrClosed", err)
	}
	_ = src.Close()
	if n := len(srv.ShutdownCalls()); n != 1 {
		t.Errorf("second Close: Shutdown called %d times, want 1", n)
	}
}

func TestMemoryInfoV2Probe(t *testing.T) {
	tests := []struct {
		name            string
		haveV2          bool
		v2Return        gonvml.Return
		wantV2Calls     int
		wantV1Calls     int
		wantUsed        uint64
		wantReserved    uint64
		wantWarningPart string
	}{
		{name: "symbol present", haveV2: true, v2Return: gonvml.SUCCESS, wantV2Calls: 1, wantUsed: 2 * gib, wantReserved: gib / 2},
		{name: "symbol absent", haveV2: false, wantV1Calls: 1, wantUsed: 3 * gib},
		{name: "v2 not supported", haveV2: true, v2Return: gonvml.ERROR_NOT_SUPPORTED, wantV2Calls: 1, wantV1Calls: 1, wantUsed: 3 * gib},
		{name: "v2 version mismatch", haveV2: true, v2Return: gonvml.ERROR_ARGUMENT_VERSION_MISMATCH, wantV2Calls: 1, wantV1Calls: 1, wantUsed: 3 * gib},
		{name: "v2 fails", haveV2: true, v2Return: gonvml.ERROR_GPU_IS_LOST, wantV2Calls: 1, wantWarningPart: "memory info v2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := dgxh100.NewWithGPUs(dgxh100.NewDevice(0).Config)
			dev := srv.Devices[0].(*server.Device)
			dev.MemoryInfo = gonvml.Memory{Total: 80 * gib, Used: 3 * gib}
			setProcesses(dev, nil, nil, nil)
			var probed []string
			srv.LookupSymbolFunc = func(name string) error {
				probed = append(probed, name)
				if name == "nvmlDeviceGetMemoryInfo_v2" && !tt.haveV2 {
					return errors.New("undefined symbol")
				}
				return nil
			}
			if tt.haveV2 {
				dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
					if tt.v2Return != gonvml.SUCCESS {
						return gonvml.Memory_v2{}, tt.v2Return
					}
					return gonvml.Memory_v2{Total: 80 * gib, Used: 2 * gib, Reserved: gib / 2}, gonvml.SUCCESS
				}
			} // else GetMemoryInfo_v2Func stays nil: calling it panics.
			snap := sample(t, open(t, Options{Library: srv}))
			if !contains(probed, "nvmlDeviceGetMemoryInfo_v2") {
				t.Errorf("probed %q, want nvmlDeviceGetMemoryInfo_v2 among them", probed)
			}
			if n := len(dev.GetMemoryInfo_v2Calls()); n != tt.wantV2Calls {
				t.Errorf("v2 calls = %d, want %d", n, tt.wantV2Calls)
			}
			if n := len(dev.GetMemoryInfoCalls()); n != tt.wantV1Calls {
				t.Errorf("v1 calls = %d, want %d", n, tt.wantV1Calls)
			}
			d := snap.Devices[0]
			if tt.wantWarningPart != "" {
				if len(snap.Warnings) != 1 || !strings.Contains(snap.Warnings[0], tt.wantWarningPart) || !strings.HasPrefix(snap.Warnings[0], "gpu 0: ") {
					t.Errorf("Warnings = %q, want one about %q", snap.Warnings, tt.wantWarningPart)
				}
				return
			}
			if d.MemoryUsedBytes != tt.wantUsed || d.MemoryReservedBytes != tt.wantReserved || d.MemoryTotalBytes != 80*gib {
				t.Errorf("memory total/used/reserved = %d/%d/%d, want %d/%d/%d", d.MemoryTotalBytes, d.MemoryUsedBytes,
					d.MemoryReservedBytes, uint64(80*gib), tt.wantUsed, tt.wantReserved)
			}
		})
	}
}

// Without the MPS symbols, the MPS list is never asked for (its func is nil:
// a call would panic).
func TestMPSProbe(t *testing.T) {
	srv, devs := h100(t)
	for _, d := range devs {
		d.GetMPSComputeRunningProcessesFunc = nil
	}
	setProcesses := func(d *server.Device) {
		d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
			return []gonvml.ProcessInfo{info(10, gib)}, gonvml.SUCCESS
		}
	}
	setProcesses(devs[0])
	srv.LookupSymbolFunc = func(name string) error {
		if strings.HasPrefix(name, "nvmlDeviceGetMPSComputeRunningProcesses") {
			return errors.New("undefined symbol")
		}
		return nil
	}
	snap := sample(t, open(t, Options{Library: srv}))
	if got := snap.Devices[0].Processes; len(got) != 1 || got[0].PID != 10 {
		t.Errorf("processes = %+v", got)
	}
}

func TestProcessListsMergedAndChecked(t *testing.T) {
	tests := []struct {
		name                    string
		compute, graphics, mps  []gonvml.ProcessInfo
		computeRet, graphicsRet gonvml.Return
		want                    []nvml.Process
		wantWarnings            []string
	}{
		{
			name:     "same pid in compute and graphics: max, not sum",
			compute:  []gonvml.ProcessInfo{info(100, 2*gib)},
			graphics: []gonvml.ProcessInfo{info(100, gib)},
			want:     []nvml.Process{known(100, 2*gib)},
		},
		{
			name:     "graphics larger wins",
			compute:  []gonvml.ProcessInfo{info(100, gib)},
			graphics: []gonvml.ProcessInfo{info(100, 3*gib)},
			want:     []nvml.Process{known(100, 3*gib)},
		},
		{
			name:    "same pid in compute and MPS",
			compute: []gonvml.ProcessInfo{info(7, gib), info(8, gib)},
			mps:     []gonvml.ProcessInfo{info(7, gib)},
			want:    []nvml.Process{known(7, gib), known(8, gib)},
		},
		{
			name:    "unknown memory is kept, flagged, and never a huge number",
			compute: []gonvml.ProcessInfo{info(5, math.MaxUint64)},
			want:    []nvml.Process{{PID: 5, GPUInstanceID: nvml.NoInstance, ComputeInstanceID: nvml.NoInstance, Util: nvml.Utilization{Known: true}}},
		},
		{
			name:     "known beats unknown, in either order",
			compute:  []gonvml.ProcessInfo{info(5, math.MaxUint64), info(6, gib)},
			graphics: []gonvml.ProcessInfo{info(5, gib), info(6, math.MaxUint64)},
			want:     []nvml.Process{known(5, gib), known(6, gib)},
		},
		{
			name:         "scrambled entries dropped with a warning",
			compute:      []gonvml.ProcessInfo{info(0, gib), info(9, 81*gib), info(10, gib)},
			want:         []nvml.Process{known(10, gib)},
			wantWarnings: []string{"gpu 0: dropped a process entry with pid 0", "gpu 0: dropped process 9: 86973087744 bytes exceeds"},
		},
		{
			name:        "graphics not supported is silent",
			compute:     []gonvml.ProcessInfo{info(1, 1)},
			graphicsRet: gonvml.ERROR_NOT_SUPPORTED,
			want:        []nvml.Process{known(1, 1)},
		},
		{
			name:         "compute failure is a warning, other lists still count",
			computeRet:   gonvml.ERROR_UNKNOWN,
			graphics:     []gonvml.ProcessInfo{info(3, gib)},
			want:         []nvml.Process{known(3, gib)},
			wantWarnings: []string{"gpu 0: nvml compute processes: "},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, devs := h100(t)
			d := devs[0]
			setProcesses(d, tt.compute, tt.graphics, tt.mps)
			if tt.computeRet != gonvml.SUCCESS {
				d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, tt.computeRet }
			}
			if tt.graphicsRet != gonvml.SUCCESS {
				d.GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, tt.graphicsRet }
			}
			snap := sample(t, open(t, Options{Library: srv}))
			if got := snap.Devices[0].Processes; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("processes:\n got %+v\nwant %+v", got, tt.want)
			}
			if len(snap.Warnings) != len(tt.wantWarnings) {
				t.Fatalf("warnings = %q, want %d like %q", snap.Warnings, len(tt.wantWarnings), tt.wantWarnings)
			}
			for i, w := range tt.wantWarnings {
				if !strings.HasPrefix(snap.Warnings[i], w) {
					t.Errorf("warning %d = %q, want prefix %q", i, snap.Warnings[i], w)
				}
			}
		})
	}
}

// known is a process with known memory on a device that reports
// utilization: it ran no kernel lately (0, known).
func known(pid int, used uint64) nvml.Process {
	return nvml.Process{PID: pid, UsedBytes: used, UsedKnown: true, GPUInstanceID: nvml.NoInstance, ComputeInstanceID: nvml.NoInstance,
		Util: nvml.Utilization{Known: true}}
}

// Errors from NVML keep the gonvml.Return: errors.Is works across the boundary.
func TestSampleErrorIsReturn(t *testing.T) {
	srv, _ := h100(t)
	srv.DeviceGetCountFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST }
	_, err := open(t, Options{Library: srv}).Sample(context.Background())
	if !errors.Is(err, gonvml.ERROR_GPU_IS_LOST) {
		t.Fatalf("Sample error = %v, want errors.Is ERROR_GPU_IS_LOST", err)
	}
	if !strings.Contains(err.Error(), "device count") {
		t.Errorf("error %q does not say what failed", err)
	}
}

func TestSampleContextCanceled(t *testing.T) {
	srv, _ := h100(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := open(t, Options{Library: srv}).Sample(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sample(canceled) = %v", err)
	}
}

func TestDeviceFailuresAreWarnings(t *testing.T) {
	srv, devs := h100(t)
	srv.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
		if i == 2 {
			return nil, gonvml.ERROR_GPU_IS_LOST
		}
		return srv.Devices[i], gonvml.SUCCESS
	}
	devs[1].GetNameFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }
	snap := sample(t, open(t, Options{Library: srv}))
	if len(snap.Devices) != 7 {
		t.Errorf("got %d devices, want 7 (gpu 2 lost)", len(snap.Devices))
	}
	wantPrefixes := []string{"gpu 1: nvml name: ", "gpu 2: nvml device handle: "}
	if len(snap.Warnings) != len(wantPrefixes) {
		t.Fatalf("warnings = %q", snap.Warnings)
	}
	for i, p := range wantPrefixes {
		if !strings.HasPrefix(snap.Warnings[i], p) {
			t.Errorf("warning %d = %q, want prefix %q", i, snap.Warnings[i], p)
		}
	}
}

// MIG: the canned server partitions GPU 0; MIG device handles are go-nvml
// mock devices answering for their instance.
func TestMIG(t *testing.T) {
	srv, devs := h100(t)
	d := devs[0]
	if ret, _ := d.SetMigMode(gonvml.DEVICE_MIG_ENABLE); ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	// MIG handles are not asked for memory v2 by the driver; NOT_SUPPORTED
	// there exercises the v1 fallback.
	migDevice := func(gi, ci int, uuid string, procs []gonvml.ProcessInfo) *mock.Device {
		return &mock.Device{
			GetUUIDFunc:              func() (string, gonvml.Return) { return uuid, gonvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, gonvml.Return) { return gi, gonvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, gonvml.Return) { return ci, gonvml.SUCCESS },
			GetMemoryInfo_v2Func: func() (gonvml.Memory_v2, gonvml.Return) {
				return gonvml.Memory_v2{}, gonvml.ERROR_NOT_SUPPORTED
			},
			GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
				return gonvml.Memory{Total: 10 * gib, Used: gib}, gonvml.SUCCESS
			},
			GetComputeRunningProcessesFunc:    func() ([]gonvml.ProcessInfo, gonvml.Return) { return procs, gonvml.SUCCESS },
			GetGraphicsRunningProcessesFunc:   func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED },
			GetMPSComputeRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.SUCCESS },
		}
	}
	slots := map[int]gonvml.Device{
		0: migDevice(1, 0, "MIG-aaaa", []gonvml.ProcessInfo{{Pid: 300, UsedGpuMemory: gib, GpuInstanceId: 1, ComputeInstanceId: 0}}),
		// the same pid in two instances: two contexts, both kept
		3: migDevice(2, 0, "MIG-bbbb", []gonvml.ProcessInfo{info(300, 2*gib), info(301, math.MaxUint64)}),
	}
	d.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 7, gonvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
		if h, ok := slots[i]; ok {
			return h, gonvml.SUCCESS
		}
		return nil, gonvml.ERROR_NOT_FOUND
	}
	// The parent's own process lists are not used with MIG on, nor its
	// per-process utilization (MIG reports none: unknown, never 0).
	d.GetComputeRunningProcessesFunc = nil
	d.GetGraphicsRunningProcessesFunc = nil
	d.GetMPSComputeRunningProcessesFunc = nil
	d.GetProcessUtilizationFunc = nil

	snap := sample(t, open(t, Options{Library: srv}))
	if len(snap.Warnings) != 0 {
		t.Errorf("warnings: %q", snap.Warnings)
	}
	got := snap.Devices[0]
	if !got.MIGEnabled || len(got.MIG) != 2 {
		t.Fatalf("MIGEnabled=%v MIG=%+v", got.MIGEnabled, got.MIG)
	}
	wantMIG := []nvml.MIGInstance{
		{UUID: "MIG-aaaa", GPUInstanceID: 1, ComputeInstanceID: 0, MemoryTotalBytes: 10 * gib, MemoryUsedBytes: gib,
			Processes: []nvml.Process{{PID: 300, UsedBytes: gib, UsedKnown: true, GPUInstanceID: 1}}},
		{UUID: "MIG-bbbb", GPUInstanceID: 2, ComputeInstanceID: 0, MemoryTotalBytes: 10 * gib, MemoryUsedBytes: gib,
			Processes: []nvml.Process{{PID: 300, UsedBytes: 2 * gib, UsedKnown: true, GPUInstanceID: 2}, {PID: 301, GPUInstanceID: 2}}},
	}
	if !reflect.DeepEqual(got.MIG, wantMIG) {
		t.Errorf("MIG:\n got %+v\nwant %+v", got.MIG, wantMIG)
	}
	wantProcs := []nvml.Process{
		{PID: 300, UsedBytes: gib, UsedKnown: true, GPUInstanceID: 1},
		{PID: 300, UsedBytes: 2 * gib, UsedKnown: true, GPUInstanceID: 2},
		{PID: 301, GPUInstanceID: 2},
	}
	if !reflect.DeepEqual(got.Processes, wantProcs) {
		t.Errorf("device processes:\n got %+v\nwant %+v", got.Processes, wantProcs)
	}
	if snap.Devices[1].MIGEnabled || snap.Devices[1].MIG != nil {
		t.Errorf("device 1 should not be MIG: %+v", snap.Devices[1])
	}
	if got.UtilizationMissing != utilMIG || snap.Devices[1].UtilizationMissing != "" {
		t.Errorf("UtilizationMissing: MIG device %q, other %q", got.UtilizationMissing, snap.Devices[1].UtilizationMissing)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestSimulatedGood(t *testing.T) {
	path, err := filepath.Abs("../testdata/sim-good.json")
	if err != nil {
		t.Fatal(err)
	}
	// Library is a mock with no funcs: the simulated file must replace NVML.
	snap := sample(t, open(t, Options{FakeGPUFile: path, Library: &mock.Interface{}}))
	want := nvml.Snapshot{Simulated: true, Devices: []nvml.Device{
		{Index: 0, UUID: "GPU-11111111-2222-3333-4444-555555555555", Name: "Simulated H100",
			MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 3 * gib, DriverVersion: "sim-1", Simulated: true,
			Processes: []nvml.Process{known(17, gib), known(99, 0), known(4242, 2*gib)}},
		{Index: 1, UUID: "GPU-SIMULATED-1", Name: "Simulated GPU", MemoryTotalBytes: 1000, MemoryUsedBytes: 600,
			MemoryReservedBytes: 100, Simulated: true, Processes: []nvml.Process{}},
	}}
	want.Devices[0].Processes[1].UsedKnown = false
	if !reflect.DeepEqual(snap, want) {
		t.Errorf("snapshot:\n got %+v\nwant %+v", snap, want)
	}
}

func BenchmarkSampleDGXH100(b *testing.B) {
	srv := dgxh100.New()
	for _, d := range srv.Devices {
		dev := d.(*server.Device)
		procs := make([]gonvml.ProcessInfo, 20)
		for i := range procs {
			procs[i] = info(uint32(1000+i), gib)
		}
		dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) { return gonvml.Memory_v2{Total: 80 * gib}, gonvml.SUCCESS }
		setProcesses(dev, procs, nil, procs[:5])
	}
	src, err := Open(Options{Library: srv})
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
