package oom

import (
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
	// Name is how a sentence names the kernel: its notebook's file name,
	// else "kernel" and its id's first 8 characters.
	Name string `json:"name"`
	User string `json:"user"`

	Framework      string `json:"framework"`
	Error          string `json:"error"`
	Message        string `json:"message"`
	RequestedBytes uint64 `json:"requested_bytes"`
	Cell           Cell   `json:"cell"`
	Kernel         Kernel `json:"kernel"`

	// GPU is nil when the daemon could not tell which GPU it was.
	GPU *GPU `json:"gpu"`
	// Holders are that GPU's holders as the finished report ranks them
	// (its GPU.Holders), each with what the event adds: this kernel's own
	// row has Self set.
	Holders []HolderRow `json:"holders"`
	// HoldersByUser is the report's GPU.HoldersByUser: what a user's view
	// (For) shows of every other user.
	HoldersByUser []attribution.Holder `json:"holders_by_user,omitempty"`
	// SampledAt is when the daemon read the figures (unix milliseconds).
	SampledAt int64 `json:"sampled_at"`

	Advice   string `json:"advice"`
	Headline string `json:"headline"`
	// View is "own" when other users are shown as one holder each, their
	// totals (see For).
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

// selfName is the name of the event's own kernel's row.
const selfName = "this kernel"

// HolderRow is one row of the event's holders: one of the report's
// ranked holders of the GPU (attribution.Holder, its fields inline in the
// JSON, Name what every face shows; the event's own kernel is named
// "this kernel") and what the event adds to it from the same report.
type HolderRow struct {
	attribution.Holder
	// Self: the row of the event's own kernel.
	Self bool `json:"self,omitempty"`
	// State is a notebook's kernel's execution state as its server last
	// said; IdleSeconds how long it has been idle.
	State       string  `json:"state,omitempty"`
	IdleSeconds float64 `json:"idle_seconds,omitempty"`
	// PIDs are the row's processes holding memory on the GPU.
	PIDs []int `json:"pids,omitempty"`
}

// Assess builds the event of an out-of-memory error of kernel kernelID,
// known by its connection file connFile (its identity: an id may name
// several kernels), from the daemon's finished report rep (sampled at
// sampledAt: attribution.Finish ranked its GPUs' holders) and the
// kernel's cleaned request. now stamps it.
func Assess(rep attribution.Report, kernelID, connFile string, req Request, sampledAt, now time.Time) Event {
	ev := Event{Time: now.Unix(), KernelID: kernelID, ConnectionFile: connFile, Framework: req.Framework, Error: req.Error,
		Message: req.Message, RequestedBytes: req.RequestedBytes, Cell: req.Cell, Kernel: req.Kernel,
		Holders: []HolderRow{}, SampledAt: sampledAt.UnixMilli()}
	// The framework's cache beyond live tensors, as every face shows it.
	ev.Kernel.CachedBytes = 0
	if k := req.Kernel; k.ReservedBytes > k.AllocatedBytes {
		ev.Kernel.CachedBytes = k.ReservedBytes - k.AllocatedBytes
	}
	self := notebookOf(rep, connFile)
	if self != nil {
		ev.Notebook, ev.User = self.Notebook, self.User
	}
	ev.Name = attribution.KernelName(ev.Notebook, shortID(kernelID))
	g := resolveGPU(rep, self, req.Device)
	if g != nil {
		ev.GPU = &GPU{Index: g.Index, Name: g.Name, UUID: g.UUID, TotalBytes: g.MemoryTotalBytes,
			UsedBytes: g.MemoryUsedBytes, FreeBytes: g.FreeBytes, Simulated: g.Simulated}
		ev.Holders = holderRows(rep, *g, connFile)
		ev.HoldersByUser = slices.Clone(g.HoldersByUser)
	}
	ev.Advice = advise(rep, ev)
	ev.Headline = headline(rep, ev)
	return ev
}

// notebookOf is rep's notebook of connection file connFile, nil when none.
func notebookOf(rep attribution.Report, connFile string) *attribution.Notebook {
	if connFile == "" {
		return nil
	}
	for i := range rep.Notebooks {
		if rep.Notebooks[i].ConnectionFile == connFile {
			return &rep.Notebooks[i]
		}
	}
	return nil
}

// holderRows are g's ranked holders, in the report's order, each with its
// notebook's state and processes on g; the kernel of connection file self
// is marked Self.
func holderRows(rep attribution.Report, g attribution.GPU, self string) []HolderRow {
	out := make([]HolderRow, 0, len(g.Holders))
	for _, h := range g.Holders {
		row := HolderRow{Holder: h}
		switch h.Kind {
		case attribution.HolderProcess:
			row.PIDs = []int{h.PID}
		case attribution.HolderNotebook:
			if self != "" && h.ConnectionFile == self {
				row.Self, row.Name = true, selfName
			}
			nb := notebookOf(rep, h.ConnectionFile)
			if nb == nil {
				break
			}
			for _, p := range nb.Processes {
				if slices.ContainsFunc(p.PerGPU, func(pg attribution.GPUBytes) bool { return pg.Index == g.Index && pg.Bytes > 0 }) {
					row.PIDs = append(row.PIDs, p.PID)
				}
			}
			if a := nb.Activity; a != nil {
				row.State = a.ExecutionState
				if a.ExecutionState == "idle" {
					row.IdleSeconds = a.IdleSeconds
				}
			}
		}
		out = append(out, row)
	}
	return out
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

// For is what a viewer who is user (not an admin) may see of e, as the
// report's own view shows a GPU (attribution.HoldersFor): their own rows
// whole, every other user as one holder, their total. The advice and
// headline never name another user's notebook, so they stay for the
// event's own user; any other viewer (the API shows an event only to its
// kernel's user: this is the second lock) sees no notebook, cell or text.
func (e Event) For(user string) Event {
	out := e
	out.View = "own"
	if user != e.User {
		out.KernelID, out.ConnectionFile, out.Notebook, out.Name, out.Message, out.Cell, out.Kernel = "", "", "", "", "", Cell{}, Kernel{}
		out.Advice, out.Headline = "", ""
	}
	holders := make([]attribution.Holder, len(e.Holders))
	rows := map[attribution.Holder][]int{} // a holder's rows in e, by index
	for i, r := range e.Holders {
		holders[i] = r.Holder
		rows[r.Holder] = append(rows[r.Holder], i)
	}
	shown := attribution.HoldersFor(attribution.GPU{Holders: holders, HoldersByUser: e.HoldersByUser}, user)
	out.Holders = make([]HolderRow, 0, len(shown))
	for _, h := range shown {
		idx := rows[h]
		if h.Kind == attribution.HolderUser || len(idx) == 0 {
			out.Holders = append(out.Holders, HolderRow{Holder: h})
			continue
		}
		r := e.Holders[idx[0]]
		rows[h] = idx[1:]
		r.PIDs = slices.Clone(r.PIDs)
		out.Holders = append(out.Holders, r)
	}
	out.HoldersByUser = slices.Clone(e.HoldersByUser)
	return out
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// bytesText is units.Bytes, the one byte formatter of the Go outputs.
func bytesText(b uint64) string { return units.Bytes(b) }
