package attribution

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// WhyDevice is one framework's memory on one device as a kernel's
// %gpumem why reports it: Held is what it holds from the driver (PyTorch's
// reserved bytes, CuPy's and JAX's pools, TensorFlow's in-use bytes).
type WhyDevice struct {
	Device    string `json:"device"` // cuda:N, as the framework numbers it
	Framework string `json:"framework"`
	Index     *int   `json:"index"`
	UUID      string `json:"uuid"`
	Held      uint64 `json:"held"`
	Used      uint64 `json:"used"`
}

// WhyKernel is what the join reads of a kernel's why data.
type WhyKernel struct {
	Devices            []WhyDevice       `json:"devices"`
	CUDAVisibleDevices *string           `json:"cuda_visible_devices"`
	ChildrenKnown      map[string]string `json:"children_known"`
}

// WhyRow is a row the join adds to the kernel's rows: memory outside the
// frameworks' allocators on a GPU, a child process, or what is left
// unexplained. Bytes is signed: an unexplained row may be negative.
type WhyRow struct {
	Category string `json:"category"` // outside, child, unexplained
	Name     string `json:"name"`
	Device   string `json:"device"`
	Bytes    int64  `json:"bytes"`
	Fix      string `json:"fix"`
	Note     string `json:"note,omitempty"`
	PID      int    `json:"pid,omitempty"`
}

// WhyDriver is the driver's figure the rows add up to.
type WhyDriver struct {
	Bytes       uint64     `json:"bytes"` // the kernel and its children, all GPUs
	PerGPU      []GPUBytes `json:"per_gpu"`
	KernelPID   int        `json:"kernel_pid"`
	Unexplained int64      `json:"unexplained"`
}

// WhyJoin is what the daemon adds to a kernel's why data.
type WhyJoin struct {
	Driver        WhyDriver      `json:"driver"`
	Rows          []WhyRow       `json:"rows"`
	StrayContexts []StrayContext `json:"stray_contexts"`
	// Evidence is the kernel's frameworks' bytes per GPU, for
	// FlagStrayContexts.
	Evidence FrameworkEvidence `json:"-"`
}

// GPUIndexOf maps a framework's device to an NVML GPU index: by UUID when
// the framework gives one, else through the kernel's CUDA_VISIBLE_DEVICES
// (an index or a UUID per entry), else CUDA's own number.
func GPUIndexOf(dev WhyDevice, visible *string, gpus []GPU) (int, bool) {
	if dev.UUID != "" {
		for _, g := range gpus {
			if normUUID(g.UUID) == normUUID(dev.UUID) {
				return g.Index, true
			}
		}
	}
	n := -1
	if dev.Index != nil {
		n = *dev.Index
	} else if rest, ok := strings.CutPrefix(dev.Device, "cuda:"); ok {
		if v, err := strconv.Atoi(rest); err == nil {
			n = v
		}
	}
	if n < 0 {
		return 0, false
	}
	if visible != nil && strings.TrimSpace(*visible) != "" {
		entries := strings.Split(*visible, ",")
		if n >= len(entries) {
			return 0, false
		}
		e := strings.TrimSpace(entries[n])
		if v, err := strconv.Atoi(e); err == nil {
			n = v
		} else {
			for _, g := range gpus {
				if strings.HasPrefix(normUUID(g.UUID), normUUID(e)) && normUUID(e) != "" {
					return g.Index, true
				}
			}
			return 0, false
		}
	}
	for _, g := range gpus {
		if g.Index == n {
			return n, true
		}
	}
	return 0, false
}

func normUUID(s string) string {
	return strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "gpu-")
}

// JoinWhy joins a kernel's why data with the driver's per-process figures
// of its notebook: per GPU, the kernel process's memory outside its
// frameworks' allocators (the driver's figure minus what they hold); a row
// per child process holding GPU memory (named as the kernel knows it, else
// by its command line from commands); and what is left unexplained, so
// that the kernel's rows and these add up to the driver's figure for the
// kernel and its children.
func JoinWhy(k WhyKernel, nb Notebook, gpus []GPU, commands map[int]string) WhyJoin {
	j := WhyJoin{Driver: WhyDriver{Bytes: nb.GPUMemoryBytes, PerGPU: nb.PerGPU}, Rows: []WhyRow{},
		StrayContexts: nb.StrayContexts}
	if len(nb.PIDs) > 0 {
		j.Driver.KernelPID = nb.PIDs[0]
	}
	held := map[int]uint64{}
	var heldAll, unmapped uint64
	for _, d := range k.Devices {
		if !strings.HasPrefix(d.Device, "cuda:") {
			continue
		}
		heldAll += d.Held
		if g, ok := GPUIndexOf(d, k.CUDAVisibleDevices, gpus); ok {
			held[g] += d.Held
		} else {
			unmapped += d.Held
		}
	}
	kernel := map[int]uint64{}
	stray := map[[2]int]StrayContext{}
	for _, sc := range nb.StrayContexts {
		stray[[2]int{sc.GPU, sc.PID}] = sc
	}
	var rows uint64 = heldAll
	for _, p := range nb.Processes {
		per := knownBytes(p.PerGPU)
		if p.PID == j.Driver.KernelPID {
			kernel = per
			continue
		}
		var total uint64
		var devs, notes []string
		for _, g := range sortedKeys(per) {
			total += per[g]
			devs = append(devs, fmt.Sprintf("GPU %d", g))
			if sc, ok := stray[[2]int{g, p.PID}]; ok {
				notes = append(notes, fmt.Sprintf("%s on GPU %d", sc.Label, g))
			}
		}
		what := k.ChildrenKnown[strconv.Itoa(p.PID)]
		if what == "" {
			what = commands[p.PID]
		}
		rows += total
		j.Rows = append(j.Rows, WhyRow{Category: "child", Name: fmt.Sprintf("pid %d: %s", p.PID, orUnknown(what)),
			Note: strings.Join(notes, ", "), Device: strings.Join(devs, "+"), Bytes: int64(total),
			Fix: "%gpumem free --children", PID: p.PID})
	}
	for _, g := range sortedKeys(kernel) {
		d := kernel[g]
		if d <= held[g] {
			continue
		}
		name, note := "outside the frameworks' allocators", "the CUDA context, cuBLAS/cuDNN handles, NCCL, CUDA graphs, other libraries"
		if sc, ok := stray[[2]int{g, j.Driver.KernelPID}]; ok {
			name, note = sc.Label, "a CUDA context with no framework memory on this GPU: "+sc.Why
		}
		rows += d - held[g]
		j.Rows = append(j.Rows, WhyRow{Category: "outside", Name: name, Note: note, Device: fmt.Sprintf("GPU %d", g),
			Bytes: int64(d - held[g]), Fix: "restart the kernel (only the process's exit frees it)"})
	}
	j.Driver.Unexplained = int64(j.Driver.Bytes) - int64(rows)
	if j.Driver.Unexplained != 0 {
		note := "the driver's figure differs from the rows: read at different moments?"
		if j.Driver.Unexplained < 0 && unmapped > 0 {
			note = fmt.Sprintf("%d bytes of framework memory are on devices no GPU here matches (CUDA_VISIBLE_DEVICES, MIG?)", unmapped)
		}
		j.Rows = append(j.Rows, WhyRow{Category: "unexplained", Name: "unexplained", Note: note, Device: "-",
			Bytes: j.Driver.Unexplained, Fix: "-"})
	}
	j.Evidence = FrameworkEvidence{PID: j.Driver.KernelPID, Held: held, DriverAt: kernel}
	return j
}

func sortedKeys(m map[int]uint64) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, cmp.Compare)
	return out
}

func orUnknown(s string) string {
	if s == "" {
		return "(command unknown)"
	}
	return s
}
