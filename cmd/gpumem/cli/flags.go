package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"
)

// newFlagSet returns a flag set that reports errors instead of exiting or
// printing: -h prints the command's help to stdout (gpumem serve -h | less
// works); a mistake is one line on stderr, from Run.
func newFlagSet(env Env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() { printHelp(env.Stdout, fs, synopsis, nil) }
	return fs
}

// flagGroup is a heading of a command's help and the flags under it.
type flagGroup struct {
	title string
	flags []string
}

// setFlagGroups makes fs's help list its flags under headings, in the
// groups' order; flags in no group follow under "Other".
func setFlagGroups(env Env, fs *flag.FlagSet, synopsis string, groups []flagGroup) {
	fs.Usage = func() { printHelp(env.Stdout, fs, synopsis, groups) }
}

// printHelp writes a command's usage line and its flags, as flag's
// PrintDefaults writes them, grouped when groups are given.
func printHelp(w io.Writer, fs *flag.FlagSet, synopsis string, groups []flagGroup) {
	fmt.Fprintf(w, "Usage: gpumem %s %s\n", fs.Name(), synopsis)
	if len(groups) == 0 {
		fmt.Fprintln(w, "\nFlags:")
		printFlags(w, fs, nil)
		return
	}
	listed := map[string]bool{}
	for _, g := range groups {
		var names []string
		for _, n := range g.flags {
			if fs.Lookup(n) != nil && !listed[n] {
				names = append(names, n)
				listed[n] = true
			}
		}
		if len(names) > 0 {
			fmt.Fprintf(w, "\n%s:\n", g.title)
			printFlags(w, fs, names)
		}
	}
	var rest []string
	fs.VisitAll(func(f *flag.Flag) {
		if !listed[f.Name] {
			rest = append(rest, f.Name)
		}
	})
	if len(rest) > 0 {
		fmt.Fprintln(w, "\nOther:")
		printFlags(w, fs, rest)
	}
}

// printFlags prints the named flags of fs (all when names is nil) in
// flag.PrintDefaults' format, with their defaults as declared.
func printFlags(w io.Writer, fs *flag.FlagSet, names []string) {
	sub := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	add := func(f *flag.Flag) {
		sub.Var(f.Value, f.Name, f.Usage)
		sub.Lookup(f.Name).DefValue = f.DefValue // not a value parsed before -h
	}
	if names == nil {
		fs.VisitAll(add)
	}
	for _, n := range names {
		add(fs.Lookup(n))
	}
	var b strings.Builder
	sub.SetOutput(&b)
	sub.PrintDefaults()
	// flag writes each flag as "  -name"; the synopsis, the README and
	// every message of gpumem write "--name" (flag accepts both).
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		if strings.HasPrefix(line, "  -") {
			line = "  --" + line[len("  -"):]
		}
		io.WriteString(w, line)
	}
}

// parseFlags parses args, wrapping errors as usage errors. It allows flags
// after positional arguments (gpumem free KERNEL --all).
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	help := fs.Usage
	fs.Usage = func() {} // flag calls it on every error too: help is printed for -h only
	defer func() { fs.Usage = help }()
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				help()
				return nil, err
			}
			return nil, fmt.Errorf("%w: %s (gpumem %s -h lists its flags)", errUsage, flagErrorText(fs, err), fs.Name())
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		if args[0] == "--" {
			return append(positional, args[1:]...), nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// undefinedFlag is how flag says a flag is not fs's.
const undefinedFlag = "flag provided but not defined: -"

// flagMention is a flag named in one of flag's errors: "-name" after a
// space or at the start.
var flagMention = regexp.MustCompile(`(^|[ :])-([A-Za-z][A-Za-z0-9-]*)`)

// flagErrorText is flag's error as gpumem writes it: flags with two dashes,
// and an unknown one with the flag it is likely a slip of.
func flagErrorText(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, undefinedFlag); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		text := fmt.Sprintf("unknown flag --%s", name)
		if s := suggest(name, names); s != "" {
			text += fmt.Sprintf("; did you mean --%s?", s)
		}
		return text
	}
	return flagMention.ReplaceAllStringFunc(msg, func(m string) string {
		sub := flagMention.FindStringSubmatch(m)
		if fs.Lookup(sub[2]) == nil {
			return m
		}
		return sub[1] + "--" + sub[2]
	})
}

// wantArgs checks the positional arguments against those the command
// takes (their names, as its synopsis writes them): a stray one is named,
// never ignored, since a mistyped flag value or a second kernel would
// otherwise be dropped without a word.
func wantArgs(fs *flag.FlagSet, pos []string, names ...string) error {
	switch {
	case len(pos) > len(names):
		takes := "no arguments"
		if len(names) > 0 {
			takes = "only " + strings.Join(names, " ")
		}
		return fmt.Errorf("%w: unexpected argument %q: gpumem %s takes %s (gpumem %s -h shows its usage)",
			errUsage, pos[len(names)], fs.Name(), takes, fs.Name())
	case len(pos) < len(names):
		return fmt.Errorf("%w: missing %s (gpumem %s -h shows its usage)", errUsage, names[len(pos)], fs.Name())
	}
	return nil
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// dirList is a repeatable flag naming directories that must exist: a
// mistyped --runtime-dir is refused, never watched in vain.
type dirList []string

func (d *dirList) String() string { return strings.Join(*d, ",") }
func (d *dirList) Set(v string) error {
	fi, err := os.Stat(v)
	switch {
	case err != nil && errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s: no such directory", v)
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%s: not a directory", v)
	}
	*d = append(*d, v)
	return nil
}

// positive refuses a zero or negative duration flag (--interval=0 would
// sample in a busy loop).
func positive(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: --%s=%v: want a duration above 0 (e.g. 1s, 500ms)", errUsage, name, d)
	}
	return nil
}
