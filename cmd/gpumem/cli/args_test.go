package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// positionals is each command's positional arguments, as its synopsis
// names them; a command missing here fails TestStrayArgumentRefused.
var positionals = map[string][]string{
	"activity": nil, "attach": {"abcd1234"}, "demo": nil, "free": {"abcd1234"}, "kernels": nil, "ls": nil,
	"serve": nil, "version": nil, "inject-cell": nil,
}

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	code = Run(context.Background(), args, env)
	return code, out.String(), errb.String()
}

func allCommands() []string {
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	for n := range hiddenCommands {
		names = append(names, n)
	}
	return names
}

// TestStrayArgumentRefused: an argument past those a command takes is a
// usage error of one line naming it, before anything runs; the same
// command with its arguments alone gets past that check.
func TestStrayArgumentRefused(t *testing.T) {
	for _, name := range allCommands() {
		pos, ok := positionals[name]
		if !ok {
			t.Errorf("command %s: add its positional arguments to positionals", name)
			continue
		}
		for _, args := range [][]string{
			append(append([]string{name}, pos...), "stray1"),
			append(append([]string{name}, pos...), "stray1", "more"),
			append(append([]string{name}, pos...), "--", "stray1"), // after --, still an argument
		} {
			code, out, errs := runCLI(args...)
			if code != 2 || out != "" || strings.Count(errs, "\n") != 1 ||
				!strings.Contains(errs, `unexpected argument "stray1"`) || !strings.HasPrefix(errs, "gpumem "+name+": ") {
				t.Errorf("gpumem %v: exit %d, stdout %q, stderr %q; want exit 2 and one line naming \"stray1\"", args, code, out, errs)
			}
		}
	}
	// The innocent: a command given exactly its arguments is not refused
	// for them (version and inject-cell then run and succeed).
	for _, name := range []string{"version", "inject-cell"} {
		if code, _, errs := runCLI(name); code != 0 || errs != "" {
			t.Errorf("gpumem %s: exit %d, stderr %q", name, code, errs)
		}
	}
	if code, _, errs := runCLI("free"); code != 2 || !strings.Contains(errs, "missing KERNEL") {
		t.Errorf("gpumem free: exit %d, stderr %q; want missing KERNEL", code, errs)
	}
}

// TestHelpWritesTwoDashes: every command's -h lists its flags as the
// synopsis and the README write them, --name, and none with one dash.
func TestHelpWritesTwoDashes(t *testing.T) {
	for _, name := range allCommands() {
		code, out, _ := runCLI(name, "-h")
		if code != 0 || !strings.HasPrefix(out, "Usage: gpumem "+name) {
			t.Errorf("gpumem %s -h: exit %d, stdout %q", name, code, out)
			continue
		}
		listed := 0
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "  --") {
				listed++
			} else if strings.HasPrefix(strings.TrimSpace(line), "-") && !strings.HasPrefix(strings.TrimSpace(line), "--") {
				t.Errorf("gpumem %s -h: a flag with one dash: %q", name, line)
			}
		}
		if listed == 0 && name != "inject-cell" {
			t.Errorf("gpumem %s -h lists no --flag:\n%s", name, out)
		}
	}
	if _, out, _ := runCLI("ls", "-h"); !strings.Contains(out, "\n  --idle\n") {
		t.Errorf("gpumem ls -h lacks --idle:\n%s", out)
	}
}

// TestDidYouMean: a slip of a command or flag names the real one; a word
// far from any, or as near to two, names none.
func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		want     string // in stderr
		wantNone bool   // no suggestion at all
	}{
		{[]string{"lss"}, "did you mean `gpumem ls`?", false},
		{[]string{"sl"}, "did you mean `gpumem ls`?", false}, // a swap is one edit
		{[]string{"kernel"}, "did you mean `gpumem kernels`?", false},
		{[]string{"fre"}, "did you mean `gpumem free`?", false},
		{[]string{"serv"}, "did you mean `gpumem serve`?", false},
		{[]string{"atach"}, "did you mean `gpumem attach`?", false},
		{[]string{"vers"}, "did you mean `gpumem version`?", false}, // a unique prefix
		{[]string{"inject-cel"}, "", true},                          // hidden commands are not offered
		{[]string{"frobnicate"}, `unknown command "frobnicate"; run 'gpumem help'`, true},
		{[]string{"ls", "--idel"}, "unknown flag --idel; did you mean --idle?", false},
		{[]string{"ls", "-jsn"}, "did you mean --json?", false},
		{[]string{"ls", "--wid"}, "did you mean --wide?", false},
		{[]string{"free", "abcd", "--al"}, "did you mean --all?", false},
		{[]string{"free", "abcd", "--childern"}, "did you mean --children?", false},
		{[]string{"serve", "--socket-mod=private"}, "did you mean --socket-mode?", false},
		{[]string{"ls", "--x"}, "unknown flag --x (gpumem ls -h", true},
		{[]string{"ls", "--zzzzz"}, "unknown flag --zzzzz", true},
	} {
		code, _, errs := runCLI(tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) || tc.wantNone == strings.Contains(errs, "did you mean") {
			t.Errorf("gpumem %v: exit %d, stderr %q; want exit 2 with %q (a suggestion: %v)", tc.args, code, errs, tc.want, !tc.wantNone)
		}
	}
	// flag's other errors name the flag with two dashes too.
	if _, _, errs := runCLI("ls", "--watch=x"); !strings.Contains(errs, "--watch") || strings.Contains(errs, " -watch") {
		t.Errorf("gpumem ls --watch=x: %q", errs)
	}
	if _, _, errs := runCLI("kernels", "--timeout"); !strings.Contains(errs, "flag needs an argument: --timeout") {
		t.Errorf("gpumem kernels --timeout: %q", errs)
	}
}

func TestSuggest(t *testing.T) {
	cands := []string{"ls", "kernels", "free", "serve", "version", "attach"}
	for _, tc := range []struct{ in, want string }{
		{"ls", ""}, {"l", "ls"}, {"x", ""}, {"kernles", "kernels"}, {"srve", "serve"},
		{"verison", "version"}, {"freee", "free"}, {"attack", "attach"}, {"abc", ""},
	} {
		if got := suggest(tc.in, cands); got != tc.want {
			t.Errorf("suggest(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// Two as near: no guess.
	if got := suggest("ab", []string{"ac", "ad"}); got != "" {
		t.Errorf("a tie suggested %q", got)
	}
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"ab", "ba", 1}, {"ls", "", 2}, {"kitten", "sitting", 3}, {"ca", "abc", 3}} {
		if got := editDistance(tc.a, tc.b); got != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
}
