package textsafe

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestLine(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"plain", "team/train.ipynb", "team/train.ipynb"},
		{"unicode kept", "données/modèle ☃.ipynb", "données/modèle ☃.ipynb"},
		{"clear screen", "\x1b[2J\x1b[Hnb.ipynb", `\x1b[2J\x1b[Hnb.ipynb`},
		{"osc title", "\x1b]0;owned\x07x", `\x1b]0;owned\x07x`},
		{"fake row", "a.ipynb\nGPU 0  fake", `a.ipynb\nGPU 0  fake`},
		{"carriage return", "freed 40 GiB\r0 B", `freed 40 GiB\r0 B`},
		{"tab", "a\tb", `a\tb`},
		{"del and nul", "a\x7fb\x00c", `a\x7fb\x00c`},
		{"c1 csi", "a\u009b2Jb", `a\u009b2Jb`},
		{"bidi override", "evil\u202egnp.ipynb", `evil\u202egnp.ipynb`},
		{"bidi isolate", "a\u2066b\u2069", `a\u2066b\u2069`},
		{"invalid utf-8", "nb\xff\xfe.ipynb", `nb\xff\xfe.ipynb`},
		{"truncated rune", "a\xe2\x82", `a\xe2\x82`},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Line(tt.in); got != tt.want {
				t.Errorf("Line(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestBlock(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"lines kept", "a\n\tb\n", "a\n\tb\n"},
		{"escapes still go", "a\n\x1b[31mred\x1b[0m\r\n", "a\n\\x1b[31mred\\x1b[0m\\r\n"},
		{"invalid utf-8", "x\xc3", `x\xc3`},
	}
	for _, tt := range tests {
		if got := Block(tt.in); got != tt.want {
			t.Errorf("%s: Block(%q) = %q, want %q", tt.name, tt.in, got, tt.want)
		}
	}
}

func TestCut(t *testing.T) {
	tests := []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdefgh", 7, "abcd…"},
		{"ééééé", 7, "éé…"}, // é is 2 bytes: never split
		{"abc", 3, "abc"},
		{"abcdef", 3, ""},
	}
	for _, tt := range tests {
		got := Cut(tt.in, tt.max)
		if got != tt.want {
			t.Errorf("Cut(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
		}
		if len(got) > tt.max || !utf8.ValidString(got) {
			t.Errorf("Cut(%q, %d) = %q: over max or not UTF-8", tt.in, tt.max, got)
		}
	}
}

func TestLabel(t *testing.T) {
	long := strings.Repeat("\xff", MaxLabelBytes)
	got := Label(long)
	if len(got) > MaxLabelBytes || !utf8.ValidString(got) || !strings.HasPrefix(got, `\xff`) {
		t.Errorf("Label of %d invalid bytes: %d bytes, valid %v, %q...", len(long), len(got), utf8.ValidString(got), got[:8])
	}
}

// Clean text is returned as it is, without a copy.
func TestLineCleanNoAlloc(t *testing.T) {
	s := "team/notebooks/train-resnet.ipynb"
	if n := testing.AllocsPerRun(100, func() { _ = Line(s) }); n != 0 {
		t.Errorf("Line of clean text allocates %v times", n)
	}
}

func FuzzLine(f *testing.F) {
	for _, s := range []string{"", "a.ipynb", "\x1b[2J", "\xff", "a\u202eb", "\r\n\t", "é\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, multiline := range []bool{false, true} {
			got := clean(s, multiline)
			if !utf8.ValidString(got) {
				t.Fatalf("clean(%q, %v) = %q: not UTF-8", s, multiline, got)
			}
			for _, r := range got {
				if unsafeRune(r, multiline) {
					t.Fatalf("clean(%q, %v) = %q keeps %U", s, multiline, got, r)
				}
			}
			if clean(got, multiline) != got {
				t.Fatalf("clean is not idempotent on %q", s)
			}
			// Nothing is dropped: clean text only grows.
			if len(got) < len(s) {
				t.Fatalf("clean(%q) = %q is shorter", s, got)
			}
		}
		if c := Label(s); len(c) > MaxLabelBytes || !utf8.ValidString(c) {
			t.Fatalf("Label(%q) = %q", s, c)
		}
	})
}
