package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// gibHours renders GPU memory held over time: one decimal, as every
// figure of gpumem's, below 1000; whole above (a column's width stays
// that of "999.9 GiB·h").
func gibHours(v float64) string {
	if v >= 999.95 {
		return fmt.Sprintf("%.0f GiB·h", v)
	}
	return fmt.Sprintf("%.1f GiB·h", v)
}

// writeIdle renders each kernel's activity beside its GPU memory, largest
// holder first: who sits on GPU memory without using it. width as writeLs.
func writeIdle(w io.Writer, rep attribution.Report, now time.Time, width int) error {
	nbs := append([]attribution.Notebook(nil), rep.Notebooks...)
	sort.SliceStable(nbs, func(i, j int) bool { return nbs[i].GPUMemoryBytes > nbs[j].GPUMemoryBytes })
	// The state and its idle time share a column: with the GPU work, the
	// memory held idle and the cull beside them, the table fits 100
	// columns with room left for the notebook's path.
	tb := newTable("", "NOTEBOOK", "KERNEL", "USER", "STATE", "MEMORY", "GPU WORK", "HOARDED", "CULL").cutMiddle(0)
	// Without a GPU (no driver) a kernel's memory is no figure: "0 B"
	// would say it holds none.
	noGPU := len(rep.GPUs) == 0
	for _, nb := range nbs {
		// The notebook's path, as ls's table shows it (not its display
		// name: the table has room for where it lies).
		name := textsafe.Line(nb.Notebook)
		if name == "" {
			name = "(no notebook)"
		}
		state, cull := "no server", "-"
		if a := nb.Activity; a != nil {
			state = orDash(a.ExecutionState)
			if a.ExecutionState == "idle" {
				state += " " + units.Seconds(a.IdleSeconds)
			}
			if !a.CullAt.IsZero() {
				cull = fmt.Sprintf("%s in %s", orDash(a.CullAction), units.Duration(a.CullAt.Sub(now)))
			}
		}
		work, hoarded := "-", "-"
		if c := nb.Compute; c != nil {
			work = orDash(c.State)
			if c.HoardedGiBHours != nil {
				hoarded = gibHours(*c.HoardedGiBHours)
			}
		}
		memory := units.Bytes(nb.GPUMemoryBytes)
		if noGPU {
			memory = "n/a"
		}
		tb.add(name, kernelColumn(nb.KernelID, width), orDash(nb.User), state, memory, work, hoarded, cull)
	}
	if err := tb.write(w, width); err != nil {
		return err
	}
	if noGPU {
		writeProse(w, "", 2, noGPUText(rep), width)
	}
	if len(rep.Hoarding) > 0 {
		parts := make([]string, len(rep.Hoarding))
		for i, h := range rep.Hoarding {
			parts[i] = orDash(h.User) + " " + gibHours(h.GiBHours)
		}
		window := time.Duration(rep.Hoarding[0].WindowSeconds) * time.Second
		writeProse(w, "", 2, fmt.Sprintf("GPU memory held while computing nothing, per user, last %s: %s", units.Duration(window), strings.Join(parts, ", ")), width)
	}
	writeLeftRunning(w, rep, width)
	return nil
}
