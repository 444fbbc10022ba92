package oom

import (
	"cmp"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// Event is one out-of-memory error as the daemon records it: the kernel
// and notebook (the daemon's knowledge, not the kernel's word), the
// kernel's request and figures, the GPU at the daemon's last sample, who
// held it, the advice and the headline.
type Event struct {
	Seq      uint64 `json:"seq"`  // the daemon's event sequence number; 0 before it is recorded
	Time     int64  `json:"time"` // unix seconds
	KernelID string `json:"kernel_id"`
	// ConnectionFile is the kernel's identity (an id may name several).
	ConnectionFile string `json:"connection_file"`
	Notebook       string `json:"notebook"`
	User           string `json:"user"`

	Framework      string `json:"framework"`
	Error          string `json:"error"`
	Message        string `json:"message"`
	RequestedBytes uint64 `json:"requested_bytes"`
	Cell           Cell   `json:"cell"`
	Kernel         Kernel `json:"kernel"`

	// GPU is nil when the daemon could not tell which GPU it was.
	GPU *GPU `json:"gpu"`
	// Holders is every process holding memory on that GPU, biggest first,
	// grouped by notebook: this kernel's own row has Self set.
	Holders []Holder `json:"holders"`
	// SampledAt is when the daemon read the figures (unix milliseconds).
	SampledAt int64 `json:"sampled_at"`

	Advice   string `json:"advice"`
	Headline string `json:"headline"`
	// View is "own" when holders of other users are shown as user and
	// bytes only (see For).
	View string `json:"view,omitempty"`
}

// GPU is the device the error hit, as the daemon last sampled it.
type GPU struct {
	Index      int    `json:"index"`
	Name       string `json:"name"`
	UUID       string `json:"uuid"`
	TotalBytes uint64 `json:"total_bytes"`
	UsedBytes  uint64 `json:"used_bytes"`
	FreeBytes  uint64 `json:"free_bytes"`
	Simulated  bool   `json:"simulated"`
}

// Holder is a notebook (all its processes on the GPU) or a process that
// belongs to no notebook.
type Holder struct {
	Kind  string `json:"kind"` // "notebook" or "process"
	Self  bool   `json:"self,omitempty"`
	User  string `json:"user"`
	Bytes uint64 `json:"bytes"`
	// Idle: the holder's server says its kernel is idle, for IdleSeconds.
	State       string  `json:"state,omitempty"`
	IdleSeconds float64 `json:"idle_seconds,omitempty"`
	// What only the holder's own user (and admins) may see.
	KernelID string `json:"kernel_id,omitempty"`
	Notebook string `json:"notebook,omitempty"`
	PIDs     []int  `json:"pids,omitempty"`
	Command  string `json:"command,omitempty"`
	// Hidden: another user's holder, shown as user and bytes only.
	Hidden bool `json:"hidden,omitempty"`
}

// Assess builds the event of an out-of-memory error of kernel kernelID,
// known by its connection file connFile (its identity: an id may name
// several kernels), from the daemon's report rep (sampled at sampledAt)
// and the kernel's cleaned request. now stamps it.
func Assess(rep attribution.Report, kernelID, connFile string, req Request, sampledAt, now time.Time) Event {
	ev := Event{Time: now.Unix(), KernelID: kernelID, ConnectionFile: connFile, Framework: req.Framework, Error: req.Error,
		Message: req.Message, RequestedBytes: req.RequestedBytes, Cell: req.Cell, Kernel: req.Kernel,
		Holders: []Holder{}, SampledAt: sampledAt.UnixMilli()}
	var self *attribution.Notebook
	for i := range rep.Notebooks {
		if rep.Notebooks[i].ConnectionFile == connFile {
			self = &rep.Notebooks[i]
			ev.Notebook, ev.User = self.Notebook, self.User
		}
	}
	g := resolveGPU(rep, self, req.Device)
	if g != nil {
		ev.GPU = &GPU{Index: g.Index, Name: g.Name, UUID: g.UUID, TotalBytes: g.MemoryTotalBytes,
			UsedBytes: g.MemoryUsedBytes, FreeBytes: g.FreeBytes, Simulated: g.Simulated}
		ev.Holders = holdersOn(rep, g.Index, connFile)
	}
	ev.Advice = advise(rep, ev)
	ev.Headline = headline(ev)
	return ev
}

// resolveGPU finds the GPU the kernel names: by UUID; else through
// CUDA_VISIBLE_DEVICES (indices or UUIDs) and the ordinal; else, without
// CUDA_VISIBLE_DEVICES, the ordinal is the index; else the GPU where the
// kernel holds most, or the only GPU. nil when none fits.
func resolveGPU(rep attribution.Report, self *attribution.Notebook, d Device) *attribution.GPU {
	byUUID := func(u string) *attribution.GPU {
		u = normUUID(u)
		if u == "" {
			return nil
		}
		for i := range rep.GPUs {
			if g := normUUID(rep.GPUs[i].UUID); g != "" && strings.HasPrefix(g, u) {
				return &rep.GPUs[i]
			}
		}
		return nil
	}
	byIndex := func(idx int) *attribution.GPU {
		for i := range rep.GPUs {
			if rep.GPUs[i].Index == idx {
				return &rep.GPUs[i]
			}
		}
		return nil
	}
	if g := byUUID(d.UUID); g != nil {
		return g
	}
	if d.Ordinal != nil {
		if d.VisibleDevices == nil {
			if g := byIndex(*d.Ordinal); g != nil {
				return g
			}
		} else if list := strings.Split(*d.VisibleDevices, ","); *d.Ordinal < len(list) {
			entry := strings.TrimSpace(list[*d.Ordinal])
			if n, err := strconv.Atoi(entry); err == nil {
				if g := byIndex(n); g != nil {
					return g
				}
			} else if strings.HasPrefix(strings.ToUpper(entry), "GPU-") {
				if g := byUUID(entry); g != nil {
					return g
				}
			}
		}
	}
	if self != nil {
		var best *attribution.GPUBytes
		for i := range self.PerGPU {
			if best == nil || self.PerGPU[i].Bytes > best.Bytes {
				best = &self.PerGPU[i]
			}
		}
		if best != nil && best.Bytes > 0 {
			if g := byIndex(best.Index); g != nil {
				return g
			}
		}
	}
	if len(rep.GPUs) == 1 {
		return &rep.GPUs[0]
	}
	return nil
}

// normUUID is a UUID as NVML and frameworks may both write it: lower case,
// without the "GPU-" prefix.
func normUUID(u string) string {
	u = strings.ToLower(strings.TrimSpace(u))
	return strings.TrimPrefix(u, "gpu-")
}

// holdersOn lists the notebooks and other processes holding memory on GPU
// index, biggest first (ties by user, then name); the kernel of connection
// file self is marked Self.
func holdersOn(rep attribution.Report, index int, self string) []Holder {
	out := []Holder{}
	for _, nb := range rep.Notebooks {
		b := onGPU(nb.PerGPU, index)
		if b == 0 && nb.ConnectionFile != self {
			continue
		}
		h := Holder{Kind: "notebook", Self: nb.ConnectionFile == self, User: nb.User, Bytes: b,
			KernelID: nb.KernelID, Notebook: nb.Notebook}
		for _, p := range nb.Processes {
			if onGPU(p.PerGPU, index) > 0 {
				h.PIDs = append(h.PIDs, p.PID)
			}
		}
		if a := nb.Activity; a != nil {
			h.State = a.ExecutionState
			if a.ExecutionState == "idle" {
				h.IdleSeconds = a.IdleSeconds
			}
		}
		out = append(out, h)
	}
	for _, o := range rep.Other {
		if b := onGPU(o.PerGPU, index); b > 0 {
			out = append(out, Holder{Kind: "process", User: o.User, Bytes: b, PIDs: []int{o.PID}, Command: o.Command})
		}
	}
	slices.SortStableFunc(out, func(a, b Holder) int {
		if c := cmp.Compare(b.Bytes, a.Bytes); c != 0 {
			return c
		}
		if c := cmp.Compare(a.User, b.User); c != 0 {
			return c
		}
		return cmp.Compare(a.Notebook+a.Command, b.Notebook+b.Command)
	})
	return out
}

func onGPU(per []attribution.GPUBytes, index int) uint64 {
	var b uint64
	for _, g := range per {
		if g.Index == index {
			b += g.Bytes
		}
	}
	return b
}

// For is what a viewer who is user (not an admin) may see of e: holders of
// other users keep their user, bytes and idleness only. The advice and
// headline never name another user's notebook, so they stay for the
// event's own user; any other viewer (the API shows an event only to its
// kernel's user: this is the second lock) sees no notebook, cell or text.
func (e Event) For(user string) Event {
	out := e
	out.View = "own"
	if user != e.User {
		out.KernelID, out.ConnectionFile, out.Notebook, out.Message, out.Cell, out.Kernel = "", "", "", "", Cell{}, Kernel{}
		out.Advice, out.Headline = "", ""
	}
	out.Holders = make([]Holder, len(e.Holders))
	for i, h := range e.Holders {
		if h.User != user || h.Self && user != e.User {
			h = Holder{Kind: h.Kind, User: h.User, Bytes: h.Bytes, State: h.State, IdleSeconds: h.IdleSeconds, Hidden: true}
		} else {
			h.PIDs = slices.Clone(h.PIDs)
		}
		out.Holders[i] = h
	}
	return out
}

// Name is how the event names its notebook: the file's name, else the
// kernel's short id.
func (e Event) Name() string {
	if e.Notebook != "" {
		return filepath.Base(e.Notebook)
	}
	return "kernel " + shortID(e.KernelID)
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// bytesText is units.Bytes, the one byte formatter of the Go outputs.
func bytesText(b uint64) string { return units.Bytes(b) }
