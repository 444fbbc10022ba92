// Package cli implements gpumem's subcommands. It is the one place that
// wires real dependencies: /proc, NVML (or the simulated GPU), the Jupyter
// runtime dirs and the kernels' ZeroMQ sockets.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/nvml/driver"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// Env is what a command may touch of the outside world.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// ProcRoot is the /proc to read ("" = "/proc"); tests point it elsewhere.
	ProcRoot string
	// NVML is the NVML serve opens (nil: the driver's); a benchmark's
	// daemon passes go-nvml's mocks. GPUMEM_FAKE_GPU still replaces it.
	NVML driver.Library
}

func (e Env) getenv(k string) string {
	if e.Getenv == nil {
		return os.Getenv(k)
	}
	return e.Getenv(k)
}

func (e Env) procRoot() string {
	if e.ProcRoot == "" {
		return "/proc"
	}
	return e.ProcRoot
}

// procFS is the /proc a command reads: one per command, shared by
// discovery and attribution.
func (e Env) procFS() *procs.FS { return &procs.FS{Root: e.procRoot()} }

type command struct {
	summary string
	run     func(ctx context.Context, env Env, args []string) error
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"activity": {"say whether this workspace is in use, as Kubeflow's activity probe reads it (GPU work counts)", runActivity},
		"attach":   {"inject the %gpumem magics into a running kernel", runAttach},
		"demo":     {"try gpumem: JupyterLab with an example notebook, on a simulated GPU where there is none", runDemo},
		"free":     {"free GPU memory in a kernel (caches only unless --vars or --all)", runFree},
		"kernels":  {"list running Jupyter kernels with their notebooks and processes", runKernels},
		"ls":       {"show GPU memory by notebook (like nvidia-smi, by notebook)", runLs},
		"serve":    {"run the sidecar daemon: attach to every kernel, reclaim orphans, serve the API and metrics", runServe},
		"version":  {"print gpumem's version and the commit it was built from", runVersion},
	}
}

// hiddenCommands serve gpumem's own checks; the usage does not list them.
var hiddenCommands = map[string]command{
	"inject-cell": {"print the cell that injects the magics, as JSON (for the GPU host's check of the magics)", runInjectCell},
}

// errUsage marks a command-line mistake: exit status 2.
var errUsage = errors.New("usage")

// Run runs gpumem with args (without the program name) and returns the exit
// status: 0 on success, 1 when the command failed, 2 on a usage error or a
// daemon's socket it does not trust (untrusted.go).
func Run(ctx context.Context, args []string, env Env) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.Stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" {
		args[0] = "version"
	}
	cmd, ok := commands[args[0]]
	if !ok {
		cmd, ok = hiddenCommands[args[0]]
	}
	if !ok {
		fmt.Fprintln(env.Stderr, unknownCommandText(args[0]))
		return 2
	}
	err := cmd.run(ctx, env, args[1:])
	line, untrusted := untrustedLine(err)
	switch {
	case err == nil:
		return 0
	case untrusted:
		// A socket another user may serve, where the command has no
		// standalone way: its one line, and no figure of it.
		fmt.Fprintln(env.Stderr, line)
		return 2
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(env.Stderr, "gpumem %s: %s\n", args[0], errorText(err))
		return 2
	default:
		fmt.Fprintf(env.Stderr, "gpumem %s: %s\n", args[0], errorText(err))
		return 1
	}
}

// linesError is an error of several lines, each written by this package:
// errorText shows each line safe on its own and keeps the lines apart.
type linesError struct{ lines []string }

func (e *linesError) Error() string { return strings.Join(e.lines, "\n") }

// errorText shows err safe for a terminal: errors name files, kernels and
// notebooks that others control, so any newline or escape in them is
// shown escaped (textsafe.Line); only a linesError's own lines stay lines.
func errorText(err error) string {
	msg := err.Error()
	var le *linesError
	if !errors.As(err, &le) || !strings.HasSuffix(msg, le.Error()) {
		return textsafe.Line(msg)
	}
	lines := make([]string, len(le.lines))
	for i, l := range le.lines {
		lines[i] = textsafe.Line(l)
	}
	return textsafe.Line(strings.TrimSuffix(msg, le.Error())) + strings.Join(lines, "\n")
}

// unknownCommandText is the line for a command gpumem does not have, with
// the one it is likely a slip of.
func unknownCommandText(name string) string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	if s := suggest(name, names); s != "" {
		return fmt.Sprintf("gpumem: unknown command %q; did you mean `gpumem %s`? (gpumem help lists the commands)", name, s)
	}
	return fmt.Sprintf("gpumem: unknown command %q; run 'gpumem help' for the list", name)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "gpumem: GPU memory by Jupyter notebook")
	fmt.Fprintln(w, "\nUsage: gpumem COMMAND [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'gpumem COMMAND -h' for a command's flags.")
}
