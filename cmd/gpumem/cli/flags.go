package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
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
	sub.SetOutput(w)
	sub.PrintDefaults()
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
			return nil, fmt.Errorf("%w: %v (gpumem %s -h lists its flags)", errUsage, err, fs.Name())
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
