package nvml

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/gpumem/gpumem/internal/safefile"
)

// The simulated-GPU file (GPUMEM_FAKE_GPU), for machines without a GPU:
//
//	{"gpus": [{"name": "Simulated H100", "uuid": "GPU-0000",
//	           "memory_total_bytes": 85899345920,
//	           "memory_used_bytes": 1073741824,      // optional: default sum of processes
//	           "memory_reserved_bytes": 0,           // optional
//	           "driver_version": "sim",              // optional
//	           "process_utilization": true,          // optional: false plays a GPU that cannot say (MIG, old driver)
//	           "processes": [{"pid": 4242, "used_bytes": 1073741824,
//	                          "sm_percent": 97, "memory_percent": 12}]}]}  // both optional, default 0
//
// A GPU's index is its position. name and uuid default to "Simulated GPU"
// and "GPU-SIMULATED-<index>". used_bytes 18446744073709551615 (max uint64)
// means unknown, as in NVML. A process without sm_percent and
// memory_percent computes nothing, as NVML says of a process it does not
// list: files written before utilization existed mean what they meant.
// Unknown keys are errors (they are usually typos).

type simFile struct {
	GPUs *[]simGPU `json:"gpus"`
}

type simGPU struct {
	Name                *string      `json:"name"`
	UUID                *string      `json:"uuid"`
	MemoryTotalBytes    *uint64      `json:"memory_total_bytes"`
	MemoryUsedBytes     *uint64      `json:"memory_used_bytes"`
	MemoryReservedBytes *uint64      `json:"memory_reserved_bytes"`
	DriverVersion       string       `json:"driver_version"`
	ProcessUtilization  *bool        `json:"process_utilization"`
	Processes           []simProcess `json:"processes"`
}

type simProcess struct {
	PID           *int    `json:"pid"`
	UsedBytes     *uint64 `json:"used_bytes"`
	SMPercent     *uint32 `json:"sm_percent"`
	MemoryPercent *uint32 `json:"memory_percent"`
}

// simNoUtilization is what a simulated GPU with "process_utilization":
// false says of its processes' utilization.
const simNoUtilization = "the simulated GPU plays one without per-process utilization"

// utilization reads a process's optional sm_percent and memory_percent.
func (p simProcess) utilization(known bool) (Utilization, error) {
	if !known {
		if p.SMPercent != nil || p.MemoryPercent != nil {
			return Utilization{}, errors.New(`sm_percent or memory_percent given on a GPU with "process_utilization": false`)
		}
		return Utilization{}, nil
	}
	u := Utilization{Known: true}
	for _, f := range []struct {
		name string
		in   *uint32
		out  *uint32
	}{{"sm_percent", p.SMPercent, &u.SMPercent}, {"memory_percent", p.MemoryPercent, &u.MemoryPercent}} {
		if f.in == nil {
			continue
		}
		if *f.in > 100 {
			return Utilization{}, fmt.Errorf("%s %d is not a percentage (0 to 100)", f.name, *f.in)
		}
		*f.out = *f.in
	}
	return u, nil
}

// simulated reads the file at every Sample. The Source serialises its
// Samples, so data and snap need no lock of their own.
type simulated struct {
	path string
	// data is the file's bytes at the last parse, snap what they said:
	// a file read again with the same bytes says the same, without the
	// JSON parse (most of what sampling a large simulated host cost).
	data []byte
	snap Snapshot
}

func (s *simulated) Close() error { return nil }

func (s *simulated) Sample(context.Context) (Snapshot, error) {
	// Read as any file another may control: never a FIFO's wait, never
	// more than a large simulated host's worth.
	data, _, err := safefile.Read(s.path, 64<<20)
	if err != nil {
		return Snapshot{}, fmt.Errorf("simulated GPU file (GPUMEM_FAKE_GPU): %w", err)
	}
	if s.data != nil && bytes.Equal(data, s.data) {
		// Shared with the last Sample's caller: a Snapshot is never
		// modified once made, and its slices are full (an append copies).
		return s.snap, nil
	}
	snap, err := parseSimulated(data)
	if err != nil {
		s.data, s.snap = nil, Snapshot{}
		return Snapshot{}, fmt.Errorf("simulated GPU file %s (GPUMEM_FAKE_GPU): %w", s.path, err)
	}
	s.data, s.snap = data, snap
	return snap, nil
}

// parseSimulated turns the file's bytes into a Snapshot; errors say where
// (line:column, or the JSON path) and what is wrong.
func parseSimulated(data []byte) (Snapshot, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f simFile
	if err := dec.Decode(&f); err != nil {
		return Snapshot{}, decodeError(data, dec, err)
	}
	rest := data[dec.InputOffset():]
	if trimmed := bytes.TrimLeft(rest, " \t\r\n"); len(trimmed) > 0 {
		line, col := lineCol(data, int64(len(data)-len(trimmed)))
		return Snapshot{}, fmt.Errorf("line %d, column %d: unexpected data after the JSON object", line, col)
	}
	if f.GPUs == nil {
		return Snapshot{}, errors.New(`missing "gpus" (want {"gpus":[{"name":…,"uuid":…,"memory_total_bytes":…,"processes":[{"pid":…,"used_bytes":…}]}]})`)
	}
	snap := Snapshot{Devices: make([]Device, 0, len(*f.GPUs)), Simulated: true}
	for i, g := range *f.GPUs {
		dev, err := g.device(i)
		if err != nil {
			return Snapshot{}, fmt.Errorf("gpus[%d]: %w", i, err)
		}
		snap.Devices = append(snap.Devices, dev)
	}
	return snap, nil
}

func (g simGPU) device(index int) (Device, error) {
	if g.MemoryTotalBytes == nil {
		return Device{}, errors.New(`missing "memory_total_bytes"`)
	}
	dev := Device{
		Index:            index,
		Name:             "Simulated GPU",
		UUID:             fmt.Sprintf("GPU-SIMULATED-%d", index),
		MemoryTotalBytes: *g.MemoryTotalBytes,
		DriverVersion:    g.DriverVersion,
		Simulated:        true,
		Processes:        make([]Process, 0, len(g.Processes)),
	}
	if g.Name != nil {
		dev.Name = *g.Name
	}
	if g.UUID != nil {
		dev.UUID = *g.UUID
	}
	if g.MemoryReservedBytes != nil {
		dev.MemoryReservedBytes = *g.MemoryReservedBytes
	}
	utilKnown := g.ProcessUtilization == nil || *g.ProcessUtilization
	if !utilKnown {
		dev.UtilizationMissing = simNoUtilization
	}
	var sum uint64
	seen := make(map[int]bool, len(g.Processes))
	for j, p := range g.Processes {
		switch {
		case p.PID == nil:
			return Device{}, fmt.Errorf(`processes[%d]: missing "pid"`, j)
		case *p.PID <= 0:
			return Device{}, fmt.Errorf(`processes[%d]: pid %d is not a process id`, j, *p.PID)
		case p.UsedBytes == nil:
			return Device{}, fmt.Errorf(`processes[%d]: missing "used_bytes" (18446744073709551615 means unknown)`, j)
		case seen[*p.PID]:
			return Device{}, fmt.Errorf(`processes[%d]: pid %d is listed twice`, j, *p.PID)
		}
		seen[*p.PID] = true
		util, err := p.utilization(utilKnown)
		if err != nil {
			return Device{}, fmt.Errorf("processes[%d]: %w", j, err)
		}
		proc := Process{PID: *p.PID, GPUInstanceID: NoInstance, ComputeInstanceID: NoInstance, Util: util}
		if *p.UsedBytes != UnknownMemory {
			proc.UsedBytes, proc.UsedKnown = *p.UsedBytes, true
			sum += proc.UsedBytes
		}
		if sum > dev.MemoryTotalBytes || sum < proc.UsedBytes {
			return Device{}, fmt.Errorf("processes use more than memory_total_bytes (%d)", dev.MemoryTotalBytes)
		}
		dev.Processes = append(dev.Processes, proc)
	}
	SortProcesses(dev.Processes)
	dev.MemoryUsedBytes = sum
	if g.MemoryUsedBytes != nil {
		dev.MemoryUsedBytes = *g.MemoryUsedBytes
	}
	if dev.MemoryUsedBytes > dev.MemoryTotalBytes {
		return Device{}, fmt.Errorf("memory_used_bytes %d exceeds memory_total_bytes %d", dev.MemoryUsedBytes, dev.MemoryTotalBytes)
	}
	return dev, nil
}

// decodeError adds a line and column to a json error.
func decodeError(data []byte, dec *json.Decoder, err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	off := int64(-1)
	switch {
	case errors.As(err, &syntax):
		off = syntax.Offset
	case errors.As(err, &typ):
		off = typ.Offset
	case errors.Is(err, io.EOF):
		return errors.New("the file is empty (want a JSON object with \"gpus\")")
	case errors.Is(err, io.ErrUnexpectedEOF):
		off = int64(len(data))
	default: // e.g. an unknown field: the decoder knows roughly where it is
		off = dec.InputOffset()
	}
	line, col := lineCol(data, off)
	return fmt.Errorf("line %d, column %d: %w", line, col, err)
}

// lineCol converts a byte offset into 1-based line and column.
func lineCol(data []byte, off int64) (line, col int) {
	off = max(0, min(off, int64(len(data))))
	before := data[:off]
	line = 1 + bytes.Count(before, []byte("\n"))
	col = int(off) - bytes.LastIndexByte(before, '\n')
	return line, col
}
