package driver

import (
	"context"
	"fmt"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpumem/gpumem/nvml"
)

// Symbols probed after Init. Calling a function the driver lacks aborts the
// process (dynamic-linker error, not a Go panic), so each optional part is
// used only when its symbols resolve.
var (
	symMemoryInfoV2 = []string{"nvmlDeviceGetMemoryInfo_v2"}
	// go-nvml dispatches MPS lists to the newest of v3/v2/v1 that resolves;
	// if none does it would call v1 regardless, so we require one.
	symMPS = []string{"nvmlDeviceGetMPSComputeRunningProcesses_v3",
		"nvmlDeviceGetMPSComputeRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses"}
	symMIG = []string{"nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
		"nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
		"nvmlDeviceGetComputeInstanceId"}
)

// real samples through an initialised NVML.
type real struct {
	lib           gonvml.Interface
	memV2         bool
	mps           bool
	mig           bool
	procUtil      bool // nvmlDeviceGetProcessUtilization resolves
	util          *utilization
	driverVersion string
	driverWarning string
}

func newReal(lib gonvml.Interface, utilWindow time.Duration) *real {
	ext := lib.Extensions()
	hasAny := func(names []string) bool {
		for _, name := range names {
			if ext.LookupSymbol(name) == nil {
				return true
			}
		}
		return false
	}
	hasAll := func(all []string) bool {
		for _, name := range all {
			if ext.LookupSymbol(name) != nil {
				return false
			}
		}
		return true
	}
	r := &real{lib: lib, memV2: hasAny(symMemoryInfoV2), mps: hasAny(symMPS), mig: hasAll(symMIG),
		procUtil: hasAny(symProcessUtilization), util: newUtilization(utilWindow)}
	if v, ret := lib.SystemGetDriverVersion(); ret == gonvml.SUCCESS {
		r.driverVersion = v
	} else {
		r.driverWarning = nvmlError("driver version", ret).Error()
	}
	return r
}

// nvmlError is the one place a gonvml.Return becomes an error.
func nvmlError(op string, ret gonvml.Return) error {
	return fmt.Errorf("nvml %s: %w", op, ret)
}

func (r *real) Close() error {
	if ret := r.lib.Shutdown(); ret != gonvml.SUCCESS {
		return nvmlError("shutdown", ret)
	}
	return nil
}

func (r *real) Sample(ctx context.Context) (nvml.Snapshot, error) {
	count, ret := r.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return nvml.Snapshot{}, nvmlError("device count", ret)
	}
	snap := nvml.Snapshot{Devices: make([]nvml.Device, 0, count)}
	if r.driverWarning != "" {
		snap.Warnings = append(snap.Warnings, r.driverWarning)
	}
	// The GPUs are read at once, one goroutine each (NVML is thread-safe):
	// a first sample on a host of several GPUs waits for the slowest, not
	// for their sum. Order and warnings stay by index.
	type read struct {
		dev      nvml.Device
		ok       bool
		warnings []string
	}
	reads := make([]read, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ctx.Err() != nil {
				return
			}
			h, ret := r.lib.DeviceGetHandleByIndex(i)
			if ret != gonvml.SUCCESS {
				reads[i].warnings = []string{fmt.Sprintf("gpu %d: %v", i, nvmlError("device handle", ret))}
				return
			}
			reads[i].dev, reads[i].warnings = r.device(i, h)
			reads[i].ok = true
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nvml.Snapshot{}, err
	}
	for _, rd := range reads {
		if rd.ok {
			snap.Devices = append(snap.Devices, rd.dev)
		}
		snap.Warnings = append(snap.Warnings, rd.warnings...)
	}
	return snap, nil
}

// device reads one GPU. Failures of one query become warnings so the rest of
// the device (and the other devices) still show.
func (r *real) device(index int, h gonvml.Device) (nvml.Device, []string) {
	var warnings []string
	warn := func(err error) { warnings = append(warnings, fmt.Sprintf("gpu %d: %v", index, err)) }

	dev := nvml.Device{Index: index, DriverVersion: r.driverVersion}
	if uuid, ret := h.GetUUID(); ret == gonvml.SUCCESS {
		dev.UUID = uuid
	} else {
		warn(nvmlError("uuid", ret))
	}
	if name, ret := h.GetName(); ret == gonvml.SUCCESS {
		dev.Name = name
	} else {
		warn(nvmlError("name", ret))
	}
	if total, used, reserved, err := r.memory(h); err == nil {
		dev.MemoryTotalBytes, dev.MemoryUsedBytes, dev.MemoryReservedBytes = total, used, reserved
	} else {
		warn(err)
	}

	if r.mig {
		current, _, ret := h.GetMigMode()
		switch {
		case ret == gonvml.SUCCESS:
			dev.MIGEnabled = current == gonvml.DEVICE_MIG_ENABLE
		case ret != gonvml.ERROR_NOT_SUPPORTED: // NOT_SUPPORTED: a GPU without MIG
			warn(nvmlError("MIG mode", ret))
		}
	}
	if !dev.MIGEnabled {
		procs, errs := r.processes(h, dev.MemoryTotalBytes)
		dev.Processes = procs
		for _, err := range errs {
			warn(err)
		}
		dev.UtilizationMissing = utilNoSymbol
		if r.procUtil {
			key := dev.UUID
			if key == "" {
				key = fmt.Sprintf("index %d", index)
			}
			var err error
			if dev.UtilizationMissing, err = r.util.fill(key, h, dev.Processes); err != nil {
				warn(err)
			}
		}
		return dev, warnings
	}
	dev.UtilizationMissing = utilMIG

	// With MIG the parent handle's process lists are aggregate only for
	// privileged callers; each MIG device handle answers for its instance.
	n, ret := h.GetMaxMigDeviceCount()
	if ret != gonvml.SUCCESS {
		warn(nvmlError("MIG device count", ret))
		return dev, warnings
	}
	dev.MIG = []nvml.MIGInstance{}
	for j := range n {
		mh, ret := h.GetMigDeviceHandleByIndex(j)
		if ret == gonvml.ERROR_NOT_FOUND { // an unused slot
			continue
		}
		if ret != gonvml.SUCCESS {
			warn(nvmlError(fmt.Sprintf("MIG device %d handle", j), ret))
			continue
		}
		inst, errs := r.migInstance(j, mh)
		for _, err := range errs {
			warn(err)
		}
		dev.MIG = append(dev.MIG, inst)
		dev.Processes = append(dev.Processes, inst.Processes...)
	}
	nvml.SortProcesses(dev.Processes)
	return dev, warnings
}

func (r *real) migInstance(slot int, h gonvml.Device) (nvml.MIGInstance, []error) {
	var errs []error
	inst := nvml.MIGInstance{GPUInstanceID: nvml.NoInstance, ComputeInstanceID: nvml.NoInstance}
	if uuid, ret := h.GetUUID(); ret == gonvml.SUCCESS {
		inst.UUID = uuid
	} else {
		errs = append(errs, nvmlError(fmt.Sprintf("MIG device %d uuid", slot), ret))
	}
	if id, ret := h.GetGpuInstanceId(); ret == gonvml.SUCCESS {
		inst.GPUInstanceID = uint32(id)
	} else {
		errs = append(errs, nvmlError(fmt.Sprintf("MIG device %d GPU instance id", slot), ret))
	}
	if id, ret := h.GetComputeInstanceId(); ret == gonvml.SUCCESS {
		inst.ComputeInstanceID = uint32(id)
	} else {
		errs = append(errs, nvmlError(fmt.Sprintf("MIG device %d compute instance id", slot), ret))
	}
	if total, used, _, err := r.memory(h); err == nil {
		inst.MemoryTotalBytes, inst.MemoryUsedBytes = total, used
	} else {
		errs = append(errs, fmt.Errorf("MIG device %d: %w", slot, err))
	}
	procs, perrs := r.processes(h, inst.MemoryTotalBytes)
	for i := range procs {
		// Entries from a MIG handle belong to that instance whatever the
		// driver filled in.
		procs[i].GPUInstanceID, procs[i].ComputeInstanceID = inst.GPUInstanceID, inst.ComputeInstanceID
	}
	inst.Processes = procs
	for _, err := range perrs {
		errs = append(errs, fmt.Errorf("MIG device %d: %w", slot, err))
	}
	return inst, errs
}

// memory returns total, used and reserved bytes: v2 when the driver has it
// (used then excludes driver-reserved memory), else v1 (reserved 0).
func (r *real) memory(h gonvml.Device) (total, used, reserved uint64, err error) {
	if r.memV2 {
		m, ret := h.GetMemoryInfo_v2()
		if ret == gonvml.SUCCESS {
			return m.Total, m.Used, m.Reserved, nil
		}
		if ret != gonvml.ERROR_NOT_SUPPORTED && ret != gonvml.ERROR_FUNCTION_NOT_FOUND &&
			ret != gonvml.ERROR_ARGUMENT_VERSION_MISMATCH {
			return 0, 0, 0, nvmlError("memory info v2", ret)
		}
		// e.g. MIG device handles, or a driver that knows another struct
		// version: fall through to v1.
	}
	m, ret := h.GetMemoryInfo()
	if ret != gonvml.SUCCESS {
		return 0, 0, 0, nvmlError("memory info", ret)
	}
	return m.Total, m.Used, 0, nil
}

// processes merges the compute, graphics and MPS lists of one device.
func (r *real) processes(h gonvml.Device, total uint64) ([]nvml.Process, []error) {
	type list struct {
		name string
		get  func() ([]gonvml.ProcessInfo, gonvml.Return)
	}
	lists := []list{
		{"compute processes", h.GetComputeRunningProcesses},
		{"graphics processes", h.GetGraphicsRunningProcesses},
	}
	if r.mps {
		lists = append(lists, list{"MPS compute processes", h.GetMPSComputeRunningProcesses})
	}
	var errs []error
	var infos []gonvml.ProcessInfo
	for _, l := range lists {
		got, ret := l.get()
		switch ret {
		case gonvml.SUCCESS:
			infos = append(infos, got...)
		case gonvml.ERROR_NOT_SUPPORTED: // e.g. graphics on a compute-only GPU
		default:
			errs = append(errs, nvmlError(l.name, ret))
		}
	}
	procs, dropped := mergeProcesses(infos, total)
	return procs, append(errs, dropped...)
}

// mergeProcesses de-duplicates NVML process entries and drops implausible
// ones, returning an error line for each dropped entry.
//
// A pid can appear in several lists of one device: a process using CUDA and
// graphics (interop) is listed under compute and graphics, and an MPS client
// can appear under compute and MPS. Each list reports the same context's
// memory, so summing would double count: take the largest figure for the
// pid (per GPU/compute instance, since MIG instances hold separate contexts).
// An unknown figure never overrides a known one.
func mergeProcesses(infos []gonvml.ProcessInfo, total uint64) ([]nvml.Process, []error) {
	type key struct {
		pid    uint32
		gi, ci uint32
	}
	var errs []error
	merged := make(map[key]nvml.Process, len(infos))
	for _, in := range infos {
		known := in.UsedGpuMemory != nvml.UnknownMemory
		switch {
		case in.Pid == 0:
			// Drivers 535.43-535.86 returned scrambled entries (reported against go-nvml).
			errs = append(errs, fmt.Errorf("dropped a process entry with pid 0 (%d bytes): scrambled NVML entry", in.UsedGpuMemory))
			continue
		case known && total > 0 && in.UsedGpuMemory > total:
			errs = append(errs, fmt.Errorf("dropped process %d: %d bytes exceeds the device's %d: scrambled NVML entry", in.Pid, in.UsedGpuMemory, total))
			continue
		}
		p := nvml.Process{PID: int(in.Pid), UsedKnown: known, GPUInstanceID: in.GpuInstanceId, ComputeInstanceID: in.ComputeInstanceId}
		if known {
			p.UsedBytes = in.UsedGpuMemory
		}
		k := key{in.Pid, in.GpuInstanceId, in.ComputeInstanceId}
		if old, ok := merged[k]; ok {
			switch {
			case !p.UsedKnown:
				p = old
			case old.UsedKnown && old.UsedBytes > p.UsedBytes:
				p = old
			}
		}
		merged[k] = p
	}
	procs := make([]nvml.Process, 0, len(merged))
	for _, p := range merged {
		procs = append(procs, p)
	}
	nvml.SortProcesses(procs)
	return procs, errs
}
