package magics

import (
	"fmt"
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
}

// Render is the kernel's text marked as its own ("kernel| "), then
// gpumem's lines: each process ended or left, and the driver's figures.
// Commands and reasons come from processes' argv: they are escaped.
func (r ChildrenReport) Render() string {
	var b strings.Builder
	writeKernelText(&b, r.Text)
	if len(r.Ended)+len(r.Left) == 0 {
		b.WriteString("gpumem serve: no worker process of this kernel held GPU memory\n")
	}
	for _, o := range r.Ended {
		fmt.Fprintf(&b, "ended pid %d (%s), %s: %s\n", o.PID, textsafe.Cut(textsafe.Line(o.Command), 120), units.Bytes(o.Bytes), textsafe.Line(o.How))
	}
	for _, o := range r.Left {
		fmt.Fprintf(&b, "left pid %d (%s), %s: %s\n", o.PID, textsafe.Cut(textsafe.Line(o.Command), 120), units.Bytes(o.Bytes), textsafe.Line(o.Reason))
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
