package discovery

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// Kernels that no Jupyter server started (nbclient and papermill jobs,
// jupyter console, KernelManager in scripts, VS Code) write their connection
// files wherever their client chose, often jupyter_client's temp files
// (/tmp/tmpXXXX.json). Such a kernel is found from its process's argv: the
// file it was launched with (-f FILE). Since "-f x.json" is a common flag of
// unrelated programs and a file proves nothing by itself, such a kernel is
// listed only when FindKernels proves its process (port, owner, file named).

// ConnectionFileLister is a ProcessFinder that can also list the connection
// files kernels were launched with. Discover uses it, when Options.Procs
// implements it, to find kernels outside the runtime dirs.
type ConnectionFileLister interface {
	LaunchedConnectionFiles() ([]string, error)
}

// LaunchedConnectionFiles implements ConnectionFileLister: every file that a
// process passes as a kernel's connection file ("-f FILE", "--f=FILE",
// "--connection-file=FILE"), made absolute against that process's cwd.
func (f *ProcFinder) LaunchedConnectionFiles() ([]string, error) {
	cmdlines, err := f.fs.Cmdlines()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for pid, argv := range cmdlines {
		arg := flaggedConnectionFile(argv)
		if arg == "" {
			continue
		}
		if !filepath.IsAbs(arg) {
			cwd, err := os.Readlink(filepath.Join(f.procRoot(), strconv.Itoa(pid), "cwd"))
			if err != nil {
				continue
			}
			arg = filepath.Join(cwd, arg)
		}
		arg = filepath.Clean(arg)
		if !seen[arg] {
			seen[arg] = true
			out = append(out, arg)
		}
	}
	return out, nil
}

// flaggedConnectionFile is the .json file argv passes after -f (or as
// --f=FILE, --connection-file=FILE), or "".
func flaggedConnectionFile(argv []string) string {
	for i, arg := range argv {
		if !strings.HasSuffix(arg, ".json") {
			continue
		}
		if i > 0 && (argv[i-1] == "-f" || argv[i-1] == "--f") {
			return arg
		}
		for _, flag := range []string{"-f=", "--f=", "--connection-file="} {
			if strings.HasPrefix(arg, flag) {
				return arg[len(flag):]
			}
		}
	}
	return ""
}

// addLaunchedKernels appends the kernels launched with connection files
// outside the runtime dirs (see ConnectionFileLister). Files it cannot read
// are skipped quietly: most are not kernels' at all.
func addLaunchedKernels(res *Result, lister ConnectionFileLister, seenFile map[string]bool) {
	files, err := lister.LaunchedConnectionFiles()
	if err != nil {
		return // FindKernels reports an unreadable /proc
	}
	known := map[procs.FileID]bool{}
	for _, k := range res.Kernels {
		known[k.FileID] = true
	}
	for _, file := range files {
		if seenFile[file] {
			continue
		}
		seenFile[file] = true
		k, err := ReadKernelFile(file)
		if err != nil || known[k.FileID] { // a runtime dir's file by another path
			continue
		}
		known[k.FileID] = true
		k.outside = true
		res.Kernels = append(res.Kernels, k)
	}
}

// dropUnprovenOutside removes the kernels found outside the runtime dirs
// whose process was not proven to serve their file.
func dropUnprovenOutside(kernels []Kernel) []Kernel {
	out := kernels[:0]
	for _, k := range kernels {
		if k.outside && !k.PIDProven {
			continue
		}
		out = append(out, k)
	}
	return out
}

func (f *ProcFinder) procRoot() string {
	if f.fs.Root == "" {
		return "/proc"
	}
	return f.fs.Root
}

// ResolveProcesses fills in, in place, the processes of kernels the caller
// read (such as one connection file a user named) and names their
// notebooks as Discover does.
func ResolveProcesses(pf ProcessFinder, kernels []Kernel) []error {
	problems := resolvePIDs(pf, kernels)
	nameNotebooks(pf, kernels)
	return problems
}
