// Package textsafe is the one sanitiser of text that users or kernels
// control (notebook paths, kernel ids, argv, user names, a kernel's own
// report) before a terminal, a toast or a Prometheus label shows it. Such
// text may hold escape sequences (ANSI CSI, OSC) that clear a screen, move
// the cursor or retitle a window, carriage returns that overwrite a line,
// newlines that draw a fake row, bidirectional overrides that reorder what
// is read, or bytes that are not UTF-8 (file names and environments are
// bytes on Linux). Each is shown as a visible escape instead (`\x1b`,
// `\r`, `\u202e`, `\xff`), so the text stays recognisable and two
// different inputs stay different.
//
// It is a pure leaf: no I/O, no state, and it imports nothing of gpumem.
// Identities (the kernel id a request names, a connection file's path) are
// never sanitised: only what is shown.
package textsafe

import (
	"strings"
	"unicode/utf8"
)

// Line returns s as one line safe to show: every control character
// (C0 with tab and newline, DEL, C1), every bidirectional control and every
// byte that is not part of valid UTF-8 becomes a visible escape. The result
// is valid UTF-8 and holds no newline.
func Line(s string) string { return clean(s, false) }

// Block is Line for text of several lines (a kernel's rendered report):
// newlines and tabs are kept, everything else Line escapes is escaped.
func Block(s string) string { return clean(s, true) }

// Cut returns s cut to at most max bytes on a rune boundary, with "…" at
// the end when anything was cut (max counts it). A max under 4 returns "".
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const ellipsis = "…"
	if max < len(ellipsis)+1 {
		return ""
	}
	end := max - len(ellipsis)
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + ellipsis
}

// MaxLabelBytes bounds a label value: a notebook path or a kernel id is far
// shorter; anything longer is somebody filling a time-series database.
const MaxLabelBytes = 1024

// Label is a Prometheus label value made from text others control: Line,
// then Cut to MaxLabelBytes. Always valid UTF-8, which client_golang
// requires of every label value.
func Label(s string) string { return Cut(Line(s), MaxLabelBytes) }

func clean(s string, multiline bool) string {
	// Most text is clean: return it without allocating.
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || unsafeRune(r, multiline) {
			break
		}
		i += size
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			writeHex(&b, `\x`, uint32(s[i]), 2)
		case unsafeRune(r, multiline):
			writeEscape(&b, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// unsafeRune reports whether r must not reach a terminal as it is.
func unsafeRune(r rune, multiline bool) bool {
	switch {
	case multiline && (r == '\n' || r == '\t'):
		return false
	case r < 0x20, r == 0x7f: // C0 (ESC, BEL, BS, CR, LF...) and DEL
		return true
	case r >= 0x80 && r <= 0x9f: // C1: CSI, OSC, ST as single characters
		return true
	}
	return bidiControl(r)
}

// bidiControl: the characters that reorder displayed text (Trojan Source):
// ALM, LRM, RLM, the embeddings and overrides, the isolates.
func bidiControl(r rune) bool {
	return r == 0x061c || r == 0x200e || r == 0x200f ||
		(r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

func writeEscape(b *strings.Builder, r rune) {
	switch r {
	case '\n':
		b.WriteString(`\n`)
	case '\r':
		b.WriteString(`\r`)
	case '\t':
		b.WriteString(`\t`)
	default:
		if r < 0x80 {
			writeHex(b, `\x`, uint32(r), 2)
		} else {
			writeHex(b, `\u`, uint32(r), 4)
		}
	}
}

func writeHex(b *strings.Builder, prefix string, v uint32, digits int) {
	const hex = "0123456789abcdef"
	b.WriteString(prefix)
	for shift := 4 * (digits - 1); shift >= 0; shift -= 4 {
		b.WriteByte(hex[(v>>uint(shift))&0xf])
	}
}
