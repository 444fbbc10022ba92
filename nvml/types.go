// Package nvml owns GPUs and per-process GPU memory. It wraps an injected
// go-nvml Interface, the simulated-GPU file (GPUMEM_FAKE_GPU) and the
// no-driver fallback behind one Source.
//
// It is the only package of gpumem that imports go-nvml (cgo). It converts
// nvml.Return codes into errors once, here, with %w, so callers can still use
// errors.Is(err, gonvml.ERROR_NOT_SUPPORTED). It never calls NVML after a
// failed Init (that aborts the process), and probes newer symbols before use.
// It does not read /proc: whether a pid exists is for the caller to check.
package nvml

// Snapshot is one sample of every GPU.
type Snapshot struct {
	Devices []Device
	// Simulated is true when the figures come from the GPUMEM_FAKE_GPU file.
	Simulated bool
	// Warnings are non-fatal problems met while sampling, one line each
	// (no driver, a device that failed to answer, dropped scrambled entries).
	Warnings []string
}

// Device is one physical GPU.
type Device struct {
	Index int
	UUID  string
	Name  string
	// MemoryUsedBytes excludes driver-reserved memory when the driver has
	// nvmlDeviceGetMemoryInfo_v2 (MemoryReservedBytes then says how much);
	// with v1 it includes it and MemoryReservedBytes is 0.
	MemoryTotalBytes    uint64
	MemoryUsedBytes     uint64
	MemoryReservedBytes uint64
	DriverVersion       string
	Simulated           bool
	// MIGEnabled is true when the GPU is partitioned; MIG then lists the
	// instances, and Processes is the union of theirs.
	MIGEnabled bool
	MIG        []MIGInstance
	// Processes hold GPU memory on this device, de-duplicated per
	// (pid, GPU instance, compute instance) and sorted by PID.
	Processes []Process
}

// MIGInstance is one MIG device (a compute instance inside a GPU instance).
type MIGInstance struct {
	UUID              string
	GPUInstanceID     uint32
	ComputeInstanceID uint32
	MemoryTotalBytes  uint64
	MemoryUsedBytes   uint64
	Processes         []Process
}

// NoInstance is the GPU/compute instance id NVML reports without MIG.
const NoInstance = 0xFFFFFFFF

// Process is one process's memory on one device (or MIG instance).
type Process struct {
	// PID as NVML reports it: in the caller's pid namespace on recent
	// drivers, host pids on older ones (see procs.Table.Resolve).
	PID int
	// UsedBytes is meaningful only when UsedKnown; NVML reports "unknown"
	// (max uint64) e.g. under some virtualisation and without privileges.
	UsedBytes         uint64
	UsedKnown         bool
	GPUInstanceID     uint32
	ComputeInstanceID uint32
}
