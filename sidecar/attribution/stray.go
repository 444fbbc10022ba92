package attribution

import (
	"cmp"
	"fmt"
	"slices"
)

// StrayContext flags a (GPU, process) of a notebook's tree that holds
// memory on that GPU with no framework memory there: most likely a CUDA
// context that nothing uses, which only the process's exit frees.
type StrayContext struct {
	GPU   int    `json:"gpu"`
	PID   int    `json:"pid"`
	Bytes uint64 `json:"bytes"`
	// Cause is default_device, idle_child or visible_devices.
	Cause string `json:"cause"`
	// Label, Why and Avoid are the sentences every face shows.
	Label string `json:"label"`
	Why   string `json:"why"`
	Avoid string `json:"avoid"`
	// Evidence is "framework" when the kernel's own figures (from its
	// magics) show no framework memory on that GPU, "driver" when only the
	// driver's per-process figures do.
	Evidence string `json:"evidence"`
}

// FrameworkEvidence is what a kernel's magics last reported: the bytes its
// frameworks hold per GPU (NVML index), and the driver's figure for the
// kernel process on each GPU at that moment.
type FrameworkEvidence struct {
	PID      int
	Held     map[int]uint64
	DriverAt map[int]uint64
}

// The evidence rule's bounds. A bare CUDA context costs 300 to 600 MiB
// (518 MiB measured on an H200 with driver 580): a process whose figure on
// a GPU is at most ContextBytesMax holds little beyond its context there.
// Framework evidence holds for a GPU while the kernel's figure there has
// not grown by more than evidenceSlack since it was reported.
const (
	ContextBytesMax = 640 << 20
	evidenceSlack   = 64 << 20
)

// FlagStrayContexts sets every notebook's StrayContexts from the driver's
// per-process figures and, where a kernel reported them, its frameworks'
// (evidence by connection file, as an id may name several kernels; nil for
// none). The rule:
//   - the kernel process on GPU g: flagged when its frameworks hold nothing
//     on g (framework evidence) or, without evidence, its figure on g is at
//     most ContextBytesMax, while it works on another GPU (its frameworks
//     hold memory there, or it holds more than ContextBytesMax there). A
//     kernel that uses its GPU normally, or holds only a context after a
//     free, is never flagged;
//   - a child process on GPU g: flagged when its figure there is at most
//     ContextBytesMax (a context and next to nothing).
func FlagStrayContexts(rep *Report, evidence map[string]FrameworkEvidence) {
	for i := range rep.Notebooks {
		nb := &rep.Notebooks[i]
		nb.StrayContexts = strayContexts(*nb, evidence[nb.ConnectionFile])
	}
}

// KeepSteadyStrays drops every flag whose process's figure on its GPU
// differs from the previous sample's (prev, the last report finished; nil
// keeps every flag): a stray context is memory nothing uses, the same
// from sample to sample, while a process creating its context or
// allocating (a DataLoader worker starting, measured at 14 MiB on an
// H200 a moment before its 774 MiB) grows. A flag then shows from the
// second sample that sees it.
func KeepSteadyStrays(rep *Report, prev *Report) {
	if prev == nil {
		return
	}
	// Only the notebooks flagged now are looked up in prev: a sample
	// finishes this every second, over a host's thousands of processes,
	// and flags are rare.
	flagged := map[string]bool{}
	for _, nb := range rep.Notebooks {
		if len(nb.StrayContexts) > 0 {
			flagged[nb.ConnectionFile] = true
		}
	}
	if len(flagged) == 0 {
		return
	}
	type key struct {
		conn     string
		pid, gpu int
	}
	before := map[key]uint64{}
	for _, nb := range prev.Notebooks {
		if !flagged[nb.ConnectionFile] {
			continue
		}
		for _, p := range nb.Processes {
			for gpu, b := range knownBytes(p.PerGPU) {
				before[key{nb.ConnectionFile, p.PID, gpu}] = b
			}
		}
	}
	for i := range rep.Notebooks {
		nb := &rep.Notebooks[i]
		nb.StrayContexts = slices.DeleteFunc(nb.StrayContexts, func(sc StrayContext) bool {
			b, ok := before[key{nb.ConnectionFile, sc.PID, sc.GPU}]
			return !ok || b != sc.Bytes
		})
		if len(nb.StrayContexts) == 0 {
			nb.StrayContexts = nil
		}
	}
}

func strayContexts(nb Notebook, ev FrameworkEvidence) []StrayContext {
	if len(nb.PIDs) == 0 {
		return nil
	}
	kpid := nb.PIDs[0]
	var kernel map[int]uint64
	for _, p := range nb.Processes {
		if p.PID == kpid {
			kernel = knownBytes(p.PerGPU)
		}
	}
	hasEv := ev.PID == kpid && ev.Held != nil
	fresh := func(gpu int) bool {
		return hasEv && kernel[gpu] <= ev.DriverAt[gpu]+evidenceSlack
	}
	// The GPUs the kernel works on: its frameworks hold memory there, or it
	// holds more than a context there.
	uses := map[int]bool{}
	for gpu, b := range kernel {
		if (fresh(gpu) && ev.Held[gpu] > 0) || b > ContextBytesMax {
			uses[gpu] = true
		}
	}
	usesOther := func(gpu int) bool {
		for g := range uses {
			if g != gpu {
				return true
			}
		}
		return false
	}
	var out []StrayContext
	for _, p := range nb.Processes {
		per := knownBytes(p.PerGPU)
		for gpu, b := range per {
			if b == 0 {
				continue
			}
			var cause, evidence string
			switch {
			case p.PID == kpid && fresh(gpu):
				if ev.Held[gpu] == 0 && usesOther(gpu) {
					cause, evidence = "default_device", "framework"
				}
			case p.PID == kpid:
				if b <= ContextBytesMax && usesOther(gpu) {
					cause, evidence = "default_device", "driver"
				}
			case b <= ContextBytesMax:
				evidence = "driver"
				switch {
				case holdsMoreElsewhere(per, gpu):
					cause = "default_device"
				case len(uses) > 0 && !uses[gpu]:
					cause = "visible_devices"
				default:
					cause = "idle_child"
				}
			}
			if cause != "" {
				out = append(out, strayContext(gpu, p.PID, b, cause, evidence, uses))
			}
		}
	}
	slices.SortFunc(out, func(a, b StrayContext) int { return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.PID, b.PID)) })
	return out
}

func holdsMoreElsewhere(per map[int]uint64, gpu int) bool {
	for g, b := range per {
		if g != gpu && b > ContextBytesMax {
			return true
		}
	}
	return false
}

func knownBytes(per []GPUBytes) map[int]uint64 {
	out := map[int]uint64{}
	for _, g := range per {
		if !g.BytesUnknown {
			out[g.Index] += g.Bytes
		}
	}
	return out
}

func strayContext(gpu, pid int, b uint64, cause, evidence string, uses map[int]bool) StrayContext {
	sc := StrayContext{GPU: gpu, PID: pid, Bytes: b, Cause: cause, Evidence: evidence,
		Label: fmt.Sprintf("stray context (≈ %d MiB)", (b+1<<19)>>20)}
	switch cause {
	case "default_device":
		sc.Why = fmt.Sprintf("pid %d holds memory on GPU %d but computes on another GPU: the default device was used "+
			"before torch.cuda.set_device(), or by torch.cuda.synchronize(), a barrier or torch.cuda.current_device().", pid, gpu)
		sc.Avoid = "Call torch.cuda.set_device(N) before any other CUDA call (or pass device= explicitly), " +
			"or start the kernel with CUDA_VISIBLE_DEVICES=N; only the process's exit frees this context."
	case "visible_devices":
		used := make([]int, 0, len(uses))
		for g := range uses {
			used = append(used, g)
		}
		slices.Sort(used)
		sc.Why = fmt.Sprintf("child pid %d holds a CUDA context on GPU %d, which the kernel does not use (it uses GPU %s): "+
			"it likely inherited the wrong CUDA_VISIBLE_DEVICES.", pid, gpu, joinInts(used))
		sc.Avoid = "Give the child its CUDA_VISIBLE_DEVICES explicitly (the kernel's GPU, or \"\" if it needs none); " +
			"%gpumem free --children ends it."
	default:
		sc.Why = fmt.Sprintf("child pid %d initialised CUDA on GPU %d and allocates (almost) nothing there.", pid, gpu)
		sc.Avoid = "Keep CUDA out of worker processes (move tensors to the GPU in the kernel, not in DataLoader " +
			"workers or subprocesses) or start them with CUDA_VISIBLE_DEVICES=\"\"; %gpumem free --children ends it."
	}
	return sc
}
