package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// resolveKernel finds the one kernel that arg names: a connection file, a
// kernel id or a unique prefix of one, or a notebook path (absolute, relative
// to the working directory, or a unique suffix such as "train.ipynb").
func resolveKernel(ctx context.Context, env Env, arg string, dirs []string) (discovery.Kernel, error) {
	fs := env.procFS()
	res := discoverKernels(ctx, env, discovery.NewProcFinder(fs), dirs)
	if arg == "" {
		return discovery.Kernel{}, fmt.Errorf("%w: name a kernel: its id (or a unique prefix), its notebook, or its connection file", errUsage)
	}
	// A connection file given directly, wherever it lies (nbclient,
	// papermill, jupyter console and scripts write theirs elsewhere, e.g.
	// jupyter_client's /tmp/tmpXXXX.json). Naming the file is the user's
	// choice of kernel; attaching then proves it (a reply signed with its
	// key).
	if strings.HasSuffix(arg, ".json") {
		if abs, err := filepath.Abs(arg); err == nil {
			for _, k := range res.Kernels {
				if k.ConnectionFile == abs {
					return k, nil
				}
			}
			if _, err := os.Stat(abs); err == nil {
				return connectionFileKernel(fs, abs)
			}
		}
	}
	var matches []discovery.Kernel
	for _, k := range res.Kernels {
		if k.ID == arg {
			return k, nil
		}
		if strings.HasPrefix(k.ID, arg) {
			matches = append(matches, k)
		}
	}
	if len(matches) == 0 {
		abs, _ := filepath.Abs(arg)
		for _, k := range res.Kernels {
			if k.Notebook == "" {
				continue
			}
			if k.Notebook == arg || k.Notebook == abs || strings.HasSuffix(k.Notebook, string(filepath.Separator)+arg) {
				matches = append(matches, k)
			}
		}
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		return discovery.Kernel{}, &linesError{append([]string{fmt.Sprintf("no kernel matches %q; running kernels:", arg)},
			candidates(res.Kernels)...)}
	default:
		return discovery.Kernel{}, &linesError{append([]string{fmt.Sprintf("%q matches %d kernels; use more of the id:", arg, len(matches))},
			candidates(matches)...)}
	}
}

// minKernelPrefix is the shortest kernel id prefix a command that changes
// a kernel accepts: one character ("0") matches a sixteenth of all
// kernels, and a typo would free another notebook's variables.
const minKernelPrefix = 4

// longEnoughToAct refuses a name too short to pick a kernel safely for a
// command that changes it. A notebook's file name ("a.ipynb") and a
// connection file are always long enough.
func longEnoughToAct(arg string) error {
	if n := len([]rune(arg)); n > 0 && n < minKernelPrefix {
		return fmt.Errorf("%w: %q is too short to name the kernel to change: give at least %d characters of its id, "+
			"or its notebook's name (gpumem kernels lists both)", errUsage, arg, minKernelPrefix)
	}
	return nil
}

// candidates lists kernels one a line, for an error that asks to choose.
func candidates(ks []discovery.Kernel) []string {
	if len(ks) == 0 {
		return []string{"  (none found: is Jupyter running as this user? try --runtime-dir)"}
	}
	lines := make([]string, 0, len(ks))
	for _, k := range ks {
		lines = append(lines, fmt.Sprintf("  %s  %s", orDash(k.ID), orDash(k.Notebook)))
	}
	sort.Strings(lines)
	return lines
}

// connectionFileKernel is the kernel of a connection file outside the
// runtime dirs: the file read and validated (an error names it), its
// process found as discovery finds any kernel's, its notebook named where
// the kernel's environment says it.
func connectionFileKernel(fs *procs.FS, path string) (discovery.Kernel, error) {
	k, err := discovery.ReadKernelFile(path)
	if err != nil {
		return discovery.Kernel{}, err
	}
	ks := []discovery.Kernel{k}
	discovery.ResolveProcesses(discovery.NewProcFinder(fs), ks)
	return ks[0], nil
}
