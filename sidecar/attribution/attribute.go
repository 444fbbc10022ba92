package attribution

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// Kernel is a running kernel as discovery found it.
type Kernel struct {
	ID string // kernel id: public, and not unique (anyone may name a file after another's)
	// ConnectionFile is the kernel's identity: the path of its connection
	// file ("" where the caller has none).
	ConnectionFile string
	Notebook       string // absolute notebook path; "" when unknown
	PID            int    // the kernel process
	// StartTime is the kernel process's start time (clock ticks since boot,
	// /proc/<pid>/stat field 22); 0 means unknown, and then whatever process
	// has PID is taken for the kernel.
	StartTime uint64
}

// MaxCommandLen bounds OtherProcess.Command, in bytes.
const MaxCommandLen = 200

// DetailPIDs lists the processes Attribute needs in full (user, command):
// the kernels and the GPU processes, sorted, each once. Pass it to
// procs.FS.ScanTree.
func DetailPIDs(snap nvml.Snapshot, kernels []Kernel) []int {
	n := len(kernels)
	for _, d := range snap.Devices {
		n += len(d.Processes)
	}
	// Sorted rather than deduplicated through a map: thousands of GPU
	// processes, every second, and a map of them was most of what this
	// allocated.
	pids := make([]int, 0, n)
	for _, k := range kernels {
		if k.PID > 0 {
			pids = append(pids, k.PID)
		}
	}
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if p.PID > 0 {
				pids = append(pids, p.PID)
			}
		}
	}
	slices.Sort(pids)
	return slices.Compact(pids)
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
	rep := Report{Warnings: slices.Clone(snap.Warnings)}
	if table == nil {
		table = procs.NewTable(nil)
		rep.Warnings = append(rep.Warnings, "process table unavailable: GPU memory not attributed to notebooks")
	}
	c := claim(snap, table, kernels)
	var unresolved []int
	rep.GPUs, unresolved = c.charge(snap)
	rep.Notebooks = c.notebooks()
	rep.Other = c.others()
	if len(unresolved) > 0 && table.Len() > 0 {
		slices.Sort(unresolved)
		unresolved = slices.Compact(unresolved)
		rep.Warnings = append(rep.Warnings, fmt.Sprintf(
			"GPU processes not found in /proc (exited since, or in a pid namespace this /proc does not show): pids %s",
			joinInts(unresolved)))
	}
	return rep
}

// claims is what each kernel claims of the GPU processes, and then what
// each was charged.
type claims struct {
	table     *procs.Table
	kernels   []Kernel
	resolved  map[int]procs.Proc // NVML pid → the process as the table knows it
	kernelOf  map[int][]int      // table pid of a GPU process → kernels claiming it
	kernelPID []int              // each kernel's pid in the table's namespace
	byKernel  []*usage
	other     map[int]*usage // by NVML pid
	otherProc map[int]procs.Proc
}

// usage is bytes per GPU, in total and per process.
type usage struct {
	perGPU map[int]*GPUBytes
	pids   map[int]map[int]*GPUBytes // pid → gpu → bytes
}

func newUsage() *usage { return &usage{perGPU: map[int]*GPUBytes{}, pids: map[int]map[int]*GPUBytes{}} }

func (u *usage) add(gpu int, p nvml.Process) {
	addBytes(u.perGPU, gpu, p)
	if u.pids[p.PID] == nil {
		u.pids[p.PID] = map[int]*GPUBytes{}
	}
	addBytes(u.pids[p.PID], gpu, p)
}

func addBytes(m map[int]*GPUBytes, gpu int, p nvml.Process) {
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

// claim resolves the GPU processes in the table (NVML's pid may be from
// another pid namespace) and lists, for each, the kernels whose process
// sets include it.
func claim(snap nvml.Snapshot, table *procs.Table, kernels []Kernel) *claims {
	c := &claims{table: table, kernels: kernels, resolved: map[int]procs.Proc{}, kernelOf: map[int][]int{},
		kernelPID: make([]int, len(kernels)), byKernel: make([]*usage, len(kernels)),
		other: map[int]*usage{}, otherProc: map[int]procs.Proc{}}
	onGPU := map[int]bool{}
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if tp, ok := table.Resolve(p.PID); ok {
				c.resolved[p.PID] = tp
				onGPU[tp.PID] = true
			}
		}
	}
	for ki, k := range kernels {
		c.byKernel[ki] = newUsage()
		c.kernelPID[ki] = k.PID
		if kp, ok := table.Resolve(k.PID); ok {
			c.kernelPID[ki] = kp.PID
		}
		for _, p := range table.KernelProcesses(c.kernelPID[ki], k.StartTime) {
			if onGPU[p.PID] {
				c.kernelOf[p.PID] = append(c.kernelOf[p.PID], ki)
			}
		}
	}
	return c
}

// charge adds each GPU process's bytes to its kernel, or to Other, and
// returns the GPUs with their totals and the GPU pids not in the table.
func (c *claims) charge(snap nvml.Snapshot) (gpus []GPU, unresolved []int) {
	gpus = make([]GPU, 0, len(snap.Devices))
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
			tp, found := c.resolved[p.PID]
			if !found {
				unresolved = append(unresolved, p.PID)
			}
			if ki, ok := owner(c.table, tp, c.kernelOf[tp.PID], c.kernelPID); found && ok {
				c.byKernel[ki].add(d.Index, p)
				gpu.NotebookBytes += known(p)
				continue
			}
			u := c.other[p.PID]
			if u == nil {
				u = newUsage()
				c.other[p.PID] = u
				c.otherProc[p.PID] = tp
			}
			u.add(d.Index, p)
			gpu.OtherBytes += known(p)
		}
		gpus = append(gpus, gpu)
	}
	return gpus, unresolved
}

// notebooks is one entry per kernel, largest first.
func (c *claims) notebooks() []Notebook {
	out := make([]Notebook, 0, len(c.kernels))
	for ki, k := range c.kernels {
		u := c.byKernel[ki]
		nb := Notebook{KernelID: k.ID, ConnectionFile: k.ConnectionFile, Notebook: k.Notebook, PIDs: []int{}, PerGPU: perGPU(u.perGPU),
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
		if kp, ok := c.table.Lookup(c.kernelPID[ki], k.StartTime); ok {
			nb.User = kp.User
			if nb.Notebook == "" {
				nb.Notebook = kp.SessionName // JPY_SESSION_NAME, jupyter_server ≥ 2
			}
		}
		if nb.User == "" { // the kernel is gone: its orphans' user
			for _, pid := range rest {
				if p, ok := c.table.Resolve(pid); ok && p.User != "" {
					nb.User = p.User
					break
				}
			}
		}
		out = append(out, nb)
	}
	slices.SortStableFunc(out, func(a, b Notebook) int {
		return cmp.Or(cmp.Compare(b.GPUMemoryBytes, a.GPUMemoryBytes),
			cmp.Compare(a.Notebook, b.Notebook), cmp.Compare(a.KernelID, b.KernelID), cmp.Compare(a.ConnectionFile, b.ConnectionFile))
	})
	return out
}

// others is the GPU processes of no kernel, largest first.
func (c *claims) others() []OtherProcess {
	out := []OtherProcess{}
	for pid, u := range c.other {
		o := OtherProcess{PID: pid, PerGPU: perGPU(u.perGPU)}
		if p := c.otherProc[pid]; p.PID != 0 {
			o.User = p.User
			o.Command = command(p)
		}
		out = append(out, o)
	}
	total := func(o OtherProcess) (sum uint64) {
		for _, b := range o.PerGPU {
			sum += b.Bytes
		}
		return sum
	}
	slices.SortFunc(out, func(a, b OtherProcess) int {
		return cmp.Or(cmp.Compare(total(b), total(a)), cmp.Compare(a.PID, b.PID))
	})
	return out
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

// command is how Other names a process: its command line, cut to
// MaxCommandLen bytes.
func command(p procs.Proc) string { return procs.CommandLine(p.Argv, p.Comm, MaxCommandLen) }

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
