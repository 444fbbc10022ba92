// Package nvml owns what gpumem knows of GPUs and per-process GPU memory:
// the value types (Snapshot, Device, Process), Source (one sampler behind a
// lock), the simulated-GPU file (GPUMEM_FAKE_GPU) and the no-driver
// fallback.
//
// It is pure Go: the NVIDIA driver itself (go-nvml, cgo) is read by package
// nvml/driver, which opens a Source over it. Packages that only consume
// snapshots (attribution, api, metrics) import this one and link no cgo.
// It does not read /proc: whether a pid exists is for the caller to check.
package nvml

import (
	"cmp"
	"math"
	"slices"
)

// Snapshot is one sample of every GPU. It is not modified once made: a
// sampler may hand the same one out again, to callers that keep it.
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
	// UtilizationMissing says why this device's processes' utilization is
	// unknown ("" when the device reports it): a driver without
	// nvmlDeviceGetProcessUtilization, MIG, a GPU that does not support
	// it, or an error.
	UtilizationMissing string
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
	// Util is the process's share of the device's compute and memory
	// bandwidth just now.
	Util Utilization
}

// Utilization is NVML's per-process utilization of one process on one
// device: the share of the last sampling period in which a kernel of the
// process ran on the SMs, and in which device memory was read or written
// for it. A process that ran no kernel lately is absent from NVML's answer:
// its figures are 0, and known.
type Utilization struct {
	// Known is false when the device cannot say (see
	// Device.UtilizationMissing): then the figures are not 0 but unknown.
	Known         bool
	SMPercent     uint32
	MemoryPercent uint32
	// SampledAt is NVML's own timestamp of the reading (microseconds of
	// the CPU's clock); 0 when the process ran nothing lately, and on the
	// simulated GPU. The same reading, seen by two samples, has the same
	// SampledAt: whoever counts readings counts it once.
	SampledAt uint64
}

// UnknownMemory is what NVML puts in a process's used memory when it cannot
// tell (NVML_VALUE_NOT_AVAILABLE as an unsigned long long); the simulated
// file uses the same value.
const UnknownMemory = math.MaxUint64

// SortProcesses orders processes by pid, then GPU and compute instance.
func SortProcesses(procs []Process) {
	slices.SortFunc(procs, func(a, b Process) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID),
			cmp.Compare(a.GPUInstanceID, b.GPUInstanceID),
			cmp.Compare(a.ComputeInstanceID, b.ComputeInstanceID))
	})
}

// Equal reports whether s and o hold the same figures, element by element
// (a nil slice equals an empty one): what a caller that skips work for an
// unchanged sample compares, once a second, without reflection.
// TestEqualSeesEveryField changes each field in turn, so a field added
// later and not compared here fails it.
func (s Snapshot) Equal(o Snapshot) bool {
	return s.Simulated == o.Simulated && slices.Equal(s.Warnings, o.Warnings) &&
		slices.EqualFunc(s.Devices, o.Devices, Device.Equal)
}

// Equal reports whether d and o hold the same figures (see Snapshot.Equal).
func (d Device) Equal(o Device) bool {
	return d.Index == o.Index && d.UUID == o.UUID && d.Name == o.Name &&
		d.MemoryTotalBytes == o.MemoryTotalBytes && d.MemoryUsedBytes == o.MemoryUsedBytes &&
		d.MemoryReservedBytes == o.MemoryReservedBytes && d.DriverVersion == o.DriverVersion &&
		d.Simulated == o.Simulated && d.MIGEnabled == o.MIGEnabled && d.UtilizationMissing == o.UtilizationMissing &&
		slices.Equal(d.Processes, o.Processes) && slices.EqualFunc(d.MIG, o.MIG, MIGInstance.Equal)
}

// Equal reports whether m and o hold the same figures (see Snapshot.Equal).
func (m MIGInstance) Equal(o MIGInstance) bool {
	return m.UUID == o.UUID && m.GPUInstanceID == o.GPUInstanceID && m.ComputeInstanceID == o.ComputeInstanceID &&
		m.MemoryTotalBytes == o.MemoryTotalBytes && m.MemoryUsedBytes == o.MemoryUsedBytes &&
		slices.Equal(m.Processes, o.Processes)
}
