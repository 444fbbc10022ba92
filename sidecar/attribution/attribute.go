package attribution

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// Kernel is a running kernel as discovery found it.
type Kernel struct {
	ID       string // kernel id
	Notebook string // absolute notebook path; "" when unknown
	PID      int    // the kernel process
	// StartTime is the kernel process's start time (clock ticks since boot,
	// /proc/<pid>/stat field 22); 0 means unknown, and then whatever process
	// has PID is taken for the kernel.
	StartTime uint64
}

// MaxCommandLen bounds OtherProcess.Command, in bytes.
const MaxCommandLen = 200

// DetailPIDs lists the processes Attribute needs in full (user, command):
// the kernels and the GPU processes. Pass it to procs.FS.ScanTree.
func DetailPIDs(snap nvml.Snapshot, kernels []Kernel) []int {
	seen := make(map[int]bool)
	var pids []int
	add := func(pid int) {
		if pid > 0 && !seen[pid] {
			seen[pid] = true
			pids = append(pids, pid)
		}
	}
	for _, k := range kernels {
		add(k.PID)
	}
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			add(p.PID)
		}
	}
	return pids
}

// Attribute assigns every GPU process of snap to the kernel whose processes
// (procs.Table.KernelProcesses: its tree, and what is left of its session or
// process group) include it, or else to Other. table may be nil (no /proc):
// then every GPU process is Other.
//
// A process in several kernels' sets (a kernel started from another kernel)
// goes to its nearest kernel ancestor. A process whose memory NVML does not
// know counts 0 bytes but is listed, with BytesUnknown set. Every kernel
// appears in Notebooks, with 0 bytes when it holds no GPU memory.
func Attribute(snap nvml.Snapshot, table *procs.Table, kernels []Kernel) Report {
	rep := Report{
		GPUs:      make([]GPU, 0, len(snap.Devices)),
		Notebooks: make([]Notebook, 0, len(kernels)),
		Other:     []OtherProcess{},
		Warnings:  slices.Clone(snap.Warnings),
	}
	if table == nil {
		table = procs.NewTable(nil)
		rep.Warnings = append(rep.Warnings, "process table unavailable: GPU memory not attributed to notebooks")
	}

	// The GPU processes as the table knows them (NVML's pid may be from
	// another pid namespace).
	resolved := make(map[int]procs.Proc)
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if tp, ok := table.Resolve(p.PID); ok {
				resolved[p.PID] = tp
			}
		}
	}
	onGPU := make(map[int]bool, len(resolved))
	for _, tp := range resolved {
		onGPU[tp.PID] = true
	}
	// kernelOf maps the table pid of a GPU process to the kernels claiming it.
	kernelOf := make(map[int][]int)
	kernelPID := make([]int, len(kernels)) // each kernel's pid in the table's namespace
	for ki, k := range kernels {
		kernelPID[ki] = k.PID
		if kp, ok := table.Resolve(k.PID); ok {
			kernelPID[ki] = kp.PID
		}
		for _, p := range table.KernelProcesses(kernelPID[ki], k.StartTime) {
			if onGPU[p.PID] {
				kernelOf[p.PID] = append(kernelOf[p.PID], ki)
			}
		}
	}

	type usage struct {
		perGPU map[int]*GPUBytes
		pids   map[int]map[int]*GPUBytes // pid → gpu → bytes
	}
	newUsage := func() *usage { return &usage{perGPU: map[int]*GPUBytes{}, pids: map[int]map[int]*GPUBytes{}} }
	add := func(m map[int]*GPUBytes, gpu int, p nvml.Process) {
		b := m[gpu]
		if b == nil {
			b = &GPUBytes{Index: gpu}
			m[gpu] = b
		}
		if p.UsedKnown {
			b.Bytes += p.UsedBytes
		} else {
			b.BytesUnknown = true
		}
	}
	charge := func(u *usage, gpu int, p nvml.Process) {
		add(u.perGPU, gpu, p)
		if u.pids[p.PID] == nil {
			u.pids[p.PID] = map[int]*GPUBytes{}
		}
		add(u.pids[p.PID], gpu, p)
	}
	byKernel := make([]*usage, len(kernels))
	for ki := range byKernel {
		byKernel[ki] = newUsage()
	}
	other := make(map[int]*usage)
	otherProc := make(map[int]procs.Proc)
	var unresolved []int

	for _, d := range snap.Devices {
		gpu := GPU{
			Index: d.Index, UUID: d.UUID, Name: d.Name,
			MemoryTotalBytes: d.MemoryTotalBytes, MemoryUsedBytes: d.MemoryUsedBytes,
			Simulated: d.Simulated || snap.Simulated,
			// NVML's free: with memory info v2, used excludes the
			// driver-reserved part, which is not free either.
			FreeBytes: subSat(d.MemoryTotalBytes, d.MemoryUsedBytes+d.MemoryReservedBytes),
		}
		for _, p := range d.Processes {
			tp, found := resolved[p.PID]
			if !found {
				unresolved = append(unresolved, p.PID)
			}
			if ki, ok := owner(table, tp, kernelOf[tp.PID], kernelPID); found && ok {
				charge(byKernel[ki], d.Index, p)
				gpu.NotebookBytes += known(p)
				continue
			}
			u := other[p.PID]
			if u == nil {
				u = newUsage()
				other[p.PID] = u
				otherProc[p.PID] = tp
			}
			charge(u, d.Index, p)
			gpu.OtherBytes += known(p)
		}
		rep.GPUs = append(rep.GPUs, gpu)
	}

	for ki, k := range kernels {
		u := byKernel[ki]
		nb := Notebook{KernelID: k.ID, Notebook: k.Notebook, PIDs: []int{}, PerGPU: perGPU(u.perGPU),
			Processes: make([]ProcessBytes, 0, len(u.pids))}
		for pid, per := range u.pids {
			nb.Processes = append(nb.Processes, ProcessBytes{PID: pid, PerGPU: perGPU(per)})
		}
		slices.SortFunc(nb.Processes, func(a, b ProcessBytes) int { return cmp.Compare(a.PID, b.PID) })
		if k.PID > 0 {
			nb.PIDs = append(nb.PIDs, k.PID)
		}
		rest := make([]int, 0, len(u.pids))
		for pid := range u.pids {
			if pid != k.PID {
				rest = append(rest, pid)
			}
		}
		slices.Sort(rest)
		nb.PIDs = append(nb.PIDs, rest...)
		for _, b := range nb.PerGPU {
			nb.GPUMemoryBytes += b.Bytes
		}
		if kp, ok := table.Lookup(kernelPID[ki], k.StartTime); ok {
			nb.User = kp.User
			if nb.Notebook == "" {
				nb.Notebook = kp.SessionName // JPY_SESSION_NAME, jupyter_server ≥ 2
			}
		}
		if nb.User == "" { // the kernel is gone: its orphans' user
			for _, pid := range rest {
				if p, ok := table.Resolve(pid); ok && p.User != "" {
					nb.User = p.User
					break
				}
			}
		}
		rep.Notebooks = append(rep.Notebooks, nb)
	}
	slices.SortStableFunc(rep.Notebooks, func(a, b Notebook) int {
		return cmp.Or(cmp.Compare(b.GPUMemoryBytes, a.GPUMemoryBytes),
			cmp.Compare(a.Notebook, b.Notebook), cmp.Compare(a.KernelID, b.KernelID))
	})

	for pid, u := range other {
		o := OtherProcess{PID: pid, PerGPU: perGPU(u.perGPU)}
		if p := otherProc[pid]; p.PID != 0 {
			o.User = p.User
			o.Command = command(p)
		}
		rep.Other = append(rep.Other, o)
	}
	total := func(o OtherProcess) (sum uint64) {
		for _, b := range o.PerGPU {
			sum += b.Bytes
		}
		return sum
	}
	slices.SortFunc(rep.Other, func(a, b OtherProcess) int {
		return cmp.Or(cmp.Compare(total(b), total(a)), cmp.Compare(a.PID, b.PID))
	})

	if len(unresolved) > 0 && table.Len() > 0 {
		slices.Sort(unresolved)
		unresolved = slices.Compact(unresolved)
		rep.Warnings = append(rep.Warnings, fmt.Sprintf(
			"GPU processes not found in /proc (exited since, or in a pid namespace this /proc does not show): pids %s",
			joinInts(unresolved)))
	}
	return rep
}

// owner picks the kernel a GPU process belongs to among those claiming it:
// the nearest kernel on its parent chain, else the first claimant.
func owner(table *procs.Table, p procs.Proc, owners []int, kernelPID []int) (int, bool) {
	switch len(owners) {
	case 0:
		return 0, false
	case 1:
		return owners[0], true
	}
	seen := make(map[int]bool)
	for pid := p.PID; pid > 0 && !seen[pid]; {
		seen[pid] = true
		for _, ki := range owners {
			if kernelPID[ki] == pid {
				return ki, true
			}
		}
		parent, ok := table.Get(pid)
		if !ok {
			break
		}
		pid = parent.PPID
	}
	return owners[0], true
}

func known(p nvml.Process) uint64 {
	if p.UsedKnown {
		return p.UsedBytes
	}
	return 0
}

func perGPU(m map[int]*GPUBytes) []GPUBytes {
	out := make([]GPUBytes, 0, len(m))
	for _, b := range m {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b GPUBytes) int { return cmp.Compare(a.Index, b.Index) })
	return out
}

func subSat(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// command is argv joined by spaces, "[comm]" when argv is empty (kernel
// threads, zombies, unreadable), cut to MaxCommandLen bytes on a rune
// boundary with "…".
func command(p procs.Proc) string {
	s := strings.Join(p.Argv, " ")
	if s == "" && p.Comm != "" {
		s = "[" + p.Comm + "]"
	}
	if len(s) <= MaxCommandLen {
		return s
	}
	cut := MaxCommandLen - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
