package oom

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// minUseful is how much a step must free to be advised when the request's
// size is unknown.
const minUseful = 256 << 20

// advise is the one line of advice that fits the event, in the order of
// what the user can do themselves: memory only IPython holds in this
// kernel, fragmentation of PyTorch's cache, another holder of the GPU
// that would make room, then this kernel's own use.
func advise(rep attribution.Report, ev Event) string {
	k := ev.Kernel
	need := ev.RequestedBytes
	var free uint64
	gpu := "the GPU"
	if ev.GPU != nil {
		free, gpu = ev.GPU.FreeBytes, fmt.Sprintf("GPU %d", ev.GPU.Index)
	}
	fits := func(extra uint64) bool {
		if need == 0 {
			return extra >= minUseful
		}
		return free+extra >= need
	}
	if k.IPythonBytes > 0 && fits(k.IPythonBytes+k.ReleasableBytes) {
		return freeAllAdvice(k)
	}
	// PyTorch's allocator, before it raises, returns every whole free
	// segment to the driver and tries again: what is still cached then is
	// in pieces of segments that also hold live tensors.
	if ev.Framework == "torch" && need > 0 && k.CachedBytes >= need && !k.ExpandableSegments {
		return fmt.Sprintf("fragmented: %s free in PyTorch's cache but no block of %s: set "+
			"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA use (restart the kernel)",
			bytesText(k.CachedBytes), bytesText(need))
	}
	var self *HolderRow
	var others []HolderRow
	for i := range ev.Holders {
		if ev.Holders[i].Self {
			self = &ev.Holders[i]
		} else {
			others = append(others, ev.Holders[i])
		}
	}
	for _, h := range others {
		if fits(h.Bytes) {
			return holderAdvice(rep, ev, h, gpu)
		}
	}
	if self != nil && self.Bytes > 0 && (len(others) == 0 || self.Bytes >= others[0].Bytes) {
		if ev.Framework == "tensorflow" {
			return fmt.Sprintf("this kernel holds %s of %s and TensorFlow returns memory only when the process exits: "+
				"restart the kernel, then set tf.config.experimental.set_memory_growth before using the GPU", bytesText(self.Bytes), gpu)
		}
		return fmt.Sprintf("this kernel holds %s of %s and asked for %s more: `%%gpumem vars` shows what holds it; "+
			"free what is no longer needed or use smaller batches", bytesText(self.Bytes), gpu, bytesOrUnknown(need))
	}
	if len(others) > 0 {
		return "no single holder frees enough; the biggest: " + holderAdvice(rep, ev, others[0], gpu)
	}
	if ev.GPU == nil {
		return "gpumem serve could not tell which GPU this was: `gpumem ls` shows who holds each GPU"
	}
	return fmt.Sprintf("%s has %s free and %s was asked: it does not fit on this GPU; use smaller batches or another GPU",
		gpu, bytesText(free), bytesOrUnknown(need))
}

func bytesOrUnknown(b uint64) string {
	if b == 0 {
		return "an unknown amount"
	}
	return bytesText(b)
}

// freeAllAdvice: %gpumem free --all drops every hidden reference that holds
// GPU memory; --keep spares the user's own variables.
func freeAllAdvice(k Kernel) string {
	held := "held by " + refsText(k.IPythonRefs)
	if len(k.Variables) == 0 {
		return fmt.Sprintf("`%%gpumem free --all` returns %s %s", bytesText(k.IPythonBytes), held)
	}
	if k.VariablesTruncated {
		return fmt.Sprintf("%s is %s only: `%%gpumem free --all --dry-run` shows what --all would delete "+
			"(your variables too; --keep NAME spares one)", bytesText(k.IPythonBytes), held)
	}
	names := make([]string, len(k.Variables))
	for i, v := range k.Variables {
		names[i] = v.Name
	}
	return fmt.Sprintf("`%%gpumem free --all --keep %s` returns %s %s (your variables stay)",
		strings.Join(names, ","), bytesText(k.IPythonBytes), held)
}

// refsText names IPython's references, the saved tracebacks as one: "Out[7]
// and this traceback".
func refsText(refs []string) string {
	var names []string
	tb := false
	for _, r := range refs {
		if strings.Contains(r, "traceback") {
			tb = true
			continue
		}
		names = append(names, r)
	}
	if tb {
		names = append(names, "this traceback")
	}
	switch len(names) {
	case 0:
		return "IPython"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// holderAdvice says who holds h's memory and what frees it. Another
// user's notebook is named by its user only.
func holderAdvice(rep attribution.Report, ev Event, h HolderRow, gpu string) string {
	idle := ""
	if h.State == "idle" && h.IdleSeconds > 0 {
		idle = "idle " + units.Seconds(h.IdleSeconds)
	}
	if ev.User != "" && h.User == ev.User {
		if h.Kind == attribution.HolderProcess {
			return fmt.Sprintf("your process %d (%s) holds %s of %s: end it if it is done", h.PID, shortCommand(h.Command),
				bytesText(h.Bytes), gpu)
		}
		state := "yours"
		if idle != "" {
			state += ", " + idle
		}
		return fmt.Sprintf("%s (%s) holds %s of %s: `gpumem free %s --all` frees it, or shut its kernel down",
			notebookName(rep, h), state, bytesText(h.Bytes), gpu, kernelRef(rep, h))
	}
	who := orUnknown(h.User)
	if h.Kind == attribution.HolderProcess {
		return fmt.Sprintf("a process of user %s holds %s of %s: ask %s", who, bytesText(h.Bytes), gpu, who)
	}
	if idle != "" {
		idle = ", " + idle + ","
	}
	return fmt.Sprintf("user %s's notebook%s holds %s of %s: ask %s, or an admin (`gpumem free` as root)",
		who, idle, bytesText(h.Bytes), gpu, who)
}

// headline is the notification's one line: "Out of memory in train.ipynb
// on GPU 0: 98.0 GiB held by user b's idle notebook".
func headline(rep attribution.Report, ev Event) string {
	head := "Out of memory in " + ev.Name
	if ev.GPU == nil {
		if ev.RequestedBytes > 0 {
			return fmt.Sprintf("%s: %s asked", head, bytesText(ev.RequestedBytes))
		}
		return head
	}
	head += fmt.Sprintf(" on GPU %d", ev.GPU.Index)
	for _, h := range ev.Holders {
		if h.Self {
			continue
		}
		return fmt.Sprintf("%s: %s held by %s", head, bytesText(h.Bytes), holderPhrase(rep, ev, h))
	}
	for _, h := range ev.Holders {
		if h.Self && h.Bytes > 0 {
			return fmt.Sprintf("%s: it holds %s of %s itself", head, bytesText(h.Bytes), bytesText(ev.GPU.TotalBytes))
		}
	}
	return head
}

func holderPhrase(rep attribution.Report, ev Event, h HolderRow) string {
	idle := ""
	if h.State == "idle" {
		idle = "idle "
	}
	own := ev.User != "" && h.User == ev.User
	switch {
	case own && h.Kind == attribution.HolderProcess:
		return fmt.Sprintf("your process %d (%s)", h.PID, shortCommand(h.Command))
	case own:
		return fmt.Sprintf("your %snotebook %s", idle, notebookName(rep, h))
	case h.Kind == attribution.HolderProcess:
		return "a process of user " + orUnknown(h.User)
	}
	return fmt.Sprintf("user %s's %snotebook", orUnknown(h.User), idle)
}

// notebookName is how a sentence names h's notebook (attribution.KernelName).
func notebookName(rep attribution.Report, h HolderRow) string {
	return attribution.KernelName(notebookPath(rep, h), shortID(h.KernelID))
}

// notebookPath is the path of h's notebook in rep, "" when it has none.
func notebookPath(rep attribution.Report, h HolderRow) string {
	if nb := notebookOf(rep, h.ConnectionFile); nb != nil {
		return nb.Notebook
	}
	return ""
}

// kernelRef is what `gpumem free` accepts for h: the notebook's file name
// when no other notebook has it, else the kernel id's first 8 digits.
func kernelRef(rep attribution.Report, h HolderRow) string {
	if path := notebookPath(rep, h); path != "" {
		base := filepath.Base(path)
		n := 0
		for _, nb := range rep.Notebooks {
			if filepath.Base(nb.Notebook) == base {
				n++
			}
		}
		if n == 1 && !strings.ContainsAny(base, " '\"`$\\;&|<>()") {
			return base
		}
	}
	return shortID(h.KernelID)
}

func shortCommand(c string) string {
	f := strings.Fields(c)
	if len(f) == 0 {
		return "?"
	}
	s := filepath.Base(f[0])
	if len(f) > 1 {
		s += " " + filepath.Base(f[1])
	}
	if r := []rune(s); len(r) > 40 {
		s = string(r[:39]) + "…"
	}
	return s
}

func orUnknown(u string) string {
	if u == "" {
		return "unknown"
	}
	return u
}
