package magics

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/internal/units"
)

// ChildOutcome is one process of a kernel's tree that held GPU memory, and
// what free --children did with it: the daemon's account, never the
// kernel's.
type ChildOutcome struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
	Bytes   uint64 `json:"bytes"`
	How     string `json:"how,omitempty"`    // ended: "the frameworks' teardown", "SIGTERM", "SIGKILL"
	Reason  string `json:"reason,omitempty"` // left alone: why
	// What is the kernel's name for the process (its word, escaped when
	// shown): "DataLoader worker 0".
	What string `json:"what,omitempty"`
	// GPUs are the GPUs it holds memory on; SMPercent its newest SM
	// reading, the highest over them (nil: unknown).
	GPUs      []int   `json:"gpus,omitempty"`
	SMPercent *uint32 `json:"sm_percent,omitempty"`
	// Compute is the daemon's verdict over its compute window:
	// "computing", "idle" or "unknown".
	Compute string `json:"compute,omitempty"`
	// Confirm: it was left running for what it computes (or because that
	// is unknown); ending it needs its pid confirmed (free --children
	// --pid N). Message says so in one sentence, without the command.
	Confirm bool   `json:"confirm,omitempty"`
	Message string `json:"message,omitempty"`
}

// LeftMessage is the sentence every face shows for a worker left running
// for what it computes: "pid 1234 python (DataLoader worker 0) computes
// at 90% SM on GPU 0". Its parts come from argv and the kernel: escaped.
func (o ChildOutcome) LeftMessage() string {
	name := "process"
	if f := strings.Fields(o.Command); len(f) > 0 {
		name = filepath.Base(f[0])
	}
	name = textsafe.Cut(textsafe.Line(name), 40)
	if o.What != "" {
		name += " (" + textsafe.Cut(textsafe.Line(o.What), 60) + ")"
	}
	on := "a GPU"
	if len(o.GPUs) > 0 {
		s := make([]string, len(o.GPUs))
		for i, g := range o.GPUs {
			s[i] = fmt.Sprint(g)
		}
		on = "GPU " + strings.Join(s, ", ")
		if len(o.GPUs) > 1 {
			on = "GPUs " + strings.Join(s, ", ")
		}
	}
	switch {
	case o.Compute == "computing" && o.SMPercent != nil && *o.SMPercent > 0:
		return fmt.Sprintf("pid %d %s computes at %d%% SM on %s", o.PID, name, *o.SMPercent, on)
	case o.Compute == "computing" && o.SMPercent != nil:
		// Memory-bound work, or a pause in it just now.
		return fmt.Sprintf("pid %d %s computes on %s (0%% SM just now)", o.PID, name, on)
	case o.Compute == "computing":
		return fmt.Sprintf("pid %d %s computes on %s", o.PID, name, on)
	}
	return fmt.Sprintf("pid %d %s holds %s on %s and whether it computes is unknown", o.PID, name, units.Bytes(o.Bytes), on)
}

// ChildrenReport is the daemon's reply to free --children as `gpumem free
// --children` prints it: the processes ended and left, and the driver's
// figure for the kernel before and after, all read by the daemon, beside
// Text, the kernel's own rendering of them (its teardown, its names for
// its workers), which is only the kernel's word.
type ChildrenReport struct {
	Ended  []ChildOutcome `json:"ended"`
	Left   []ChildOutcome `json:"left"`
	Before uint64         `json:"before"`
	After  uint64         `json:"after"`
	Text   string         `json:"text"`
	// Notes are the daemon's: a teardown not run and why, a figure read
	// before a process was gone from the driver's list.
	Notes []string `json:"notes,omitempty"`
}

// Render is the kernel's text marked as its own ("kernel| "), then
// gpumem's lines: each process ended or left, and the driver's figures.
// Commands and reasons come from processes' argv: they are escaped.
// endHint is the command that ends a worker left running for what it
// computes ("gpumem free KERNEL --children --pid 1234"); nil: none said.
func (r ChildrenReport) Render(endHint func(pid int) string) string {
	var b strings.Builder
	if strings.TrimSpace(r.Text) != "" {
		writeKernelText(&b, r.Text)
	}
	if len(r.Ended)+len(r.Left) == 0 {
		b.WriteString("gpumem serve: no worker process of this kernel held GPU memory\n")
	}
	for _, o := range r.Ended {
		fmt.Fprintf(&b, "ended pid %d (%s), %s: %s\n", o.PID, textsafe.Cut(textsafe.Line(o.Command), 120), units.Bytes(o.Bytes), textsafe.Line(o.How))
	}
	for _, o := range r.Left {
		fmt.Fprintf(&b, "left pid %d (%s), %s: %s\n", o.PID, textsafe.Cut(textsafe.Line(o.Command), 120), units.Bytes(o.Bytes), textsafe.Line(o.Reason))
	}
	for _, o := range r.Left {
		if !o.Confirm {
			continue
		}
		b.WriteString("left running: " + o.LeftMessage())
		if endHint != nil {
			b.WriteString("; to end it: " + endHint(o.PID))
		}
		b.WriteByte('\n')
	}
	for _, n := range r.Notes {
		b.WriteString(textsafe.Line(n) + "\n")
	}
	fmt.Fprintf(&b, "driver (NVML, read by gpumem serve): %s -> %s for this kernel (%s); the kernel itself was left running",
		units.Bytes(r.Before), units.Bytes(r.After), units.Delta(int64(r.After)-int64(r.Before)))
	return b.String()
}

// writeKernelText writes a kernel's rendering of a report, each line
// marked as the kernel's and escaped: a kernel runs its user's code, and
// a line it writes must not pass for gpumem's.
func writeKernelText(b *strings.Builder, text string) {
	b.WriteString("the kernel's report, as the kernel wrote it:\n")
	for _, line := range strings.Split(strings.TrimRight(textsafe.Block(text), "\n"), "\n") {
		b.WriteString("  kernel| ")
		b.WriteString(line)
		b.WriteByte('\n')
	}
}
