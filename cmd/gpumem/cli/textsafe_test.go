package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
)

// hostile is what a user or a kernel may put in a notebook path, a kernel
// id (a file name), a user name or argv: a screen clear, a fake GPU row on
// a line of its own, an OSC title, a carriage return, a bidi override and
// bytes that are not UTF-8.
const hostile = "\x1b[2J\x1b[H\nGPU 0  FAKE  0 B / 80 GiB used\r\x1b]0;owned\x07\u202e\xff"

// terminalSafe fails unless out holds no control character but newlines,
// no bidi control and only valid UTF-8.
func terminalSafe(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s: not valid UTF-8:\n%q", what, out)
	}
	for _, r := range out {
		if (r < 0x20 && r != '\n') || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x202e {
			t.Errorf("%s: carries %U to the terminal:\n%q", what, r, out)
			return
		}
	}
	if strings.Contains(out, "\nGPU 0  FAKE") {
		t.Errorf("%s: a notebook drew a line of its own:\n%s", what, out)
	}
}

func TestHostileStringsNeverReachTheTerminal(t *testing.T) {
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	rep := sampleReport()
	rep.GPUs[0].Name = hostile
	rep.Notebooks[0].Notebook = "/home/eve/" + hostile + ".ipynb"
	rep.Notebooks[0].KernelID = hostile
	rep.Notebooks[0].User = hostile
	rep.Notebooks[0].Activity = &attribution.Activity{ExecutionState: hostile, CullAt: now.Add(time.Minute), CullAction: hostile}
	rep.Notebooks[2].Notebook = hostile // holds no GPU memory: listed on the last line, by its display name
	rep.Notebooks[2].DisplayName = hostile
	rep.Other[0].Command = "python " + hostile
	rep.Other[0].User = hostile

	writers := []struct {
		name  string
		write func(*bytes.Buffer) error
	}{
		{"ls", func(b *bytes.Buffer) error { return writeLs(b, rep, tableWidth) }},
		{"ls --wide", func(b *bytes.Buffer) error { return writeLs(b, rep, 0) }},
		{"ls --idle", func(b *bytes.Buffer) error { return writeIdle(b, rep, now, tableWidth) }},
		{"kernels", func(b *bytes.Buffer) error {
			return writeKernelTable(b, []kernelRow{{KernelID: hostile, Notebook: hostile, Language: hostile,
				ConnectionFile: "/run/" + hostile + ".json", ServerURL: hostile}}, tableWidth)
		}},
		{"no kernel matches", func(b *bytes.Buffer) error {
			b.WriteString(errorText(&linesError{append([]string{"no kernel matches:"},
				candidates([]discovery.Kernel{{ID: hostile, Notebook: hostile}})...)}))
			return nil
		}},
	}
	for _, w := range writers {
		var b bytes.Buffer
		if err := w.write(&b); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		terminalSafe(t, w.name, b.String())
		if !strings.Contains(b.String(), `\x1b[2J`) {
			t.Errorf("%s: the hostile text is not shown escaped:\n%s", w.name, b.String())
		}
	}
}

// An error naming a kernel, file or notebook reaches stderr safe, its
// own lines kept.
func TestErrorsReachStderrSafe(t *testing.T) {
	commands["hostile-test"] = command{"", func(_ context.Context, _ Env, _ []string) error {
		return fmt.Errorf("kernel %s: %w", hostile, &linesError{[]string{"line one " + hostile, "  line two"}})
	}}
	defer delete(commands, "hostile-test")
	var out, errb bytes.Buffer
	if code := Run(t.Context(), []string{"hostile-test"}, Env{Stdout: &out, Stderr: &errb}); code != 1 {
		t.Fatalf("exit %d", code)
	}
	terminalSafe(t, "stderr", errb.String())
	if !strings.Contains(errb.String(), "\n  line two") {
		t.Errorf("the error's own lines were lost:\n%s", errb.String())
	}
}

// The console log format (a terminal's) shows fields and messages safe.
func TestConsoleLogSafe(t *testing.T) {
	var b bytes.Buffer
	log, err := newLogger(&b, "console", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Warn().Str("notebook", hostile).Err(errors.New(hostile)).Msg("attached " + hostile)
	terminalSafe(t, "console log", strings.TrimSuffix(b.String(), "\n"))
	if strings.Count(b.String(), "\n") != 1 {
		t.Errorf("one log entry took %d lines:\n%s", strings.Count(b.String(), "\n"), b.String())
	}
}
