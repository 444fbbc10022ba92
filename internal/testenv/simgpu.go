package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// The simulated-GPU file (GPUMEM_FAKE_GPU; package nvml documents and
// reads it) is written by every test through SimulatedGPUs, here, and by
// the Python tests through simgpu.py beside this file: both must produce
// testdata/simulated-gpu.json from the same devices (TestSimulatedGPUGolden),
// so a change to the file's format is made once and fails wherever a writer
// lags.

// SimGPU is one device of the simulated-GPU file. Name and UUID are written
// as given (empty ones are nvml's defaults); UtilizationUnknown plays a GPU
// that cannot say how much its processes compute (MIG, an old driver).
type SimGPU struct {
	Name               string
	UUID               string
	MemoryTotalBytes   uint64
	UtilizationUnknown bool
	Processes          []FakeProc
}

// SimH200 is device index of a simulated host: "Simulated H200" of
// totalBytes, with the uuid every harness gives device index.
func SimH200(index int, totalBytes uint64, procs ...FakeProc) SimGPU {
	return SimGPU{Name: "Simulated H200", UUID: SimUUID(index), MemoryTotalBytes: totalBytes, Processes: procs}
}

// SimUUID is the uuid of the simulated host's device index.
func SimUUID(index int) string { return fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", index) }

type simGPUJSON struct {
	Name               string     `json:"name,omitempty"`
	UUID               string     `json:"uuid,omitempty"`
	MemoryTotalBytes   uint64     `json:"memory_total_bytes"`
	ProcessUtilization *bool      `json:"process_utilization,omitempty"`
	Processes          []FakeProc `json:"processes"`
}

// SimulatedGPUs is the simulated-GPU file listing gpus, in order (a GPU's
// index is its position).
func SimulatedGPUs(gpus ...SimGPU) []byte {
	doc := struct {
		GPUs []simGPUJSON `json:"gpus"`
	}{GPUs: make([]simGPUJSON, 0, len(gpus))}
	for _, g := range gpus {
		j := simGPUJSON{Name: g.Name, UUID: g.UUID, MemoryTotalBytes: g.MemoryTotalBytes, Processes: g.Processes}
		if j.Processes == nil {
			j.Processes = []FakeProc{}
		}
		if g.UtilizationUnknown {
			j.ProcessUtilization = new(bool)
		}
		doc.GPUs = append(doc.GPUs, j)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(fmt.Sprintf("testenv: marshalling the simulated GPUs: %v", err)) // plain values: cannot fail
	}
	return b
}

// WriteSimulatedGPUs writes the simulated-GPU file at path atomically (a
// daemon re-reads it every sample and must never see half a file), mode
// 0600.
func WriteSimulatedGPUs(t testing.TB, path string, gpus ...SimGPU) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, SimulatedGPUs(gpus...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// SimulatedGPUFile writes gpus to a new simulated-GPU file in t's
// temporary dir and returns its path.
func SimulatedGPUFile(t testing.TB, gpus ...SimGPU) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gpus.json")
	WriteSimulatedGPUs(t, path, gpus...)
	return path
}
