package cli

import (
	"io"
	"strings"
	"unicode/utf8"
)

// tableWidth is what a table fits by default: a terminal of 100 columns.
// --wide lifts it (0: no limit).
const tableWidth = 100

// minCutWidth is the narrowest a cut column gets: enough of a path to
// recognise it.
const minCutWidth = 16

// table is the CLI's one table layout: columns two spaces apart, fitted to
// a width by cutting the columns that may be cut in their middle (paths,
// commands, URLs: both ends are the telling parts), never the others.
// Cells are measured as given, in runes: callers pass the text that will
// be printed (made safe for a terminal first), so that a cut never splits
// an escape.
type table struct {
	indent string
	header []string
	cut    []bool // per column: may be cut in its middle
	order  []int  // the cut columns, the first to cut first
	rows   [][]string
}

func newTable(indent string, header ...string) *table {
	return &table{indent: indent, header: header, cut: make([]bool, len(header))}
}

// cutMiddle marks columns that may be cut to fit, the least telling
// first: each is cut down to minCutWidth before the next is touched.
func (t *table) cutMiddle(cols ...int) *table {
	for _, c := range cols {
		t.cut[c] = true
	}
	t.order = append(t.order, cols...)
	return t
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

// write prints the table within width columns (0: as wide as it needs).
func (t *table) write(w io.Writer, width int) error {
	widths := t.fit(width)
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString(t.indent)
		for i, c := range cells {
			if t.cut[i] {
				c = cutMiddleText(c, widths[i])
			}
			b.WriteString(c)
			if i < len(cells)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)+2))
			}
		}
		b.WriteString("\n")
	}
	line(t.header)
	for _, r := range t.rows {
		line(r)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// fit returns each column's width: as wide as its widest cell, then the
// cut columns narrowed in their order until the line fits width or every
// one is down to minCutWidth (or its header).
func (t *table) fit(width int) []int {
	widths := make([]int, len(t.header))
	for i, h := range t.header {
		widths[i] = utf8.RuneCountInString(h)
	}
	for _, r := range t.rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	if width <= 0 {
		return widths
	}
	total := utf8.RuneCountInString(t.indent) + 2*(len(widths)-1)
	for _, w := range widths {
		total += w
	}
	for _, c := range t.order {
		if total <= width {
			break
		}
		floor := max(minCutWidth, utf8.RuneCountInString(t.header[c]))
		if widths[c] > floor {
			cut := min(widths[c]-floor, total-width)
			widths[c] -= cut
			total -= cut
		}
	}
	return widths // wider than width only when what cannot be cut is
}

// cutMiddleText shortens s to n runes by replacing its middle with "…",
// keeping more of the end (a path's file name, a command's last argument).
func cutMiddleText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n <= 1 {
		return string(r[:n])
	}
	head := (n - 1) / 3
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}

// writeProse prints a line of sentences (a GPU's heading, a flag's why)
// within width columns (0: whole), broken between words; the lines after
// the first are indented hang more. Text is given made safe for a
// terminal, as a table's cells are. A word longer than a line stays whole.
func writeProse(w io.Writer, indent string, hang int, text string, width int) {
	var b strings.Builder
	prefix := indent
	rest := []rune(text)
	for {
		room := max(width-utf8.RuneCountInString(prefix), 1)
		if width <= 0 || len(rest) <= room {
			b.WriteString(prefix + string(rest) + "\n")
			break
		}
		cut := -1
		for i := min(room, len(rest)-1); i > 0; i-- { // the last space that fits
			if rest[i] == ' ' {
				cut = i
				break
			}
		}
		if cut < 0 { // else the first after it
			for i := room; i < len(rest); i++ {
				if rest[i] == ' ' {
					cut = i
					break
				}
			}
		}
		if cut < 0 {
			b.WriteString(prefix + string(rest) + "\n")
			break
		}
		b.WriteString(prefix + strings.TrimRight(string(rest[:cut]), " ") + "\n")
		rest = []rune(strings.TrimLeft(string(rest[cut:]), " "))
		prefix = indent + strings.Repeat(" ", hang)
	}
	_, _ = io.WriteString(w, b.String())
}
