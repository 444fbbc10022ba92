package discovery

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/safefile"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// Kernels that no Jupyter server started (nbclient and papermill jobs,
// jupyter console, KernelManager in scripts, VS Code) write their connection
// files wherever their client chose, often jupyter_client's temp files
// (/tmp/tmpXXXX.json). Such a kernel is found from its process's argv: the
// file it was launched with (-f FILE). Such a kernel belongs to the Jupyter
// whose runtime dirs are scanned when its own environment names one of them
// as its runtime dir (JUPYTER_RUNTIME_DIR, else XDG_DATA_HOME's or HOME's, as
// defaultRuntimeDir computes it): jobs inherit their user's environment, so
// this scopes them exactly as the runtime dirs scope server kernels, and
// another user's or another environment's jobs stay out. Since "-f x.json"
// is a common flag of unrelated programs and a file proves nothing by
// itself, such a kernel is listed only when FindKernels then proves its
// process (port, owner, file named).

// ConnectionFileLister is a ProcessFinder that can also list the connection
// files kernels were launched with. Discover uses it, when Options.Procs
// implements it, to find kernels outside the runtime dirs.
type ConnectionFileLister interface {
	LaunchedConnectionFiles(runtimeDirs []string) ([]string, error)
}

// LaunchedConnectionFiles implements ConnectionFileLister: every file that a
// process passes as a kernel's connection file ("-f FILE", "--f=FILE",
// "--connection-file=FILE"), made absolute against that process's cwd, when
// that process's runtime dir is one of runtimeDirs.
func (f *ProcFinder) LaunchedConnectionFiles(runtimeDirs []string) ([]string, error) {
	if f.scope != nil {
		f.askExtra() // launched kernels are looked for among extra's too
	}
	cmdlines, err := f.cmdlines()
	if err != nil {
		return nil, err
	}
	ours := map[string]bool{}
	for _, d := range runtimeDirs {
		ours[filepath.Clean(d)] = true
	}
	seen := map[string]bool{}
	var out []string
	for pid, argv := range cmdlines {
		arg := flaggedConnectionFile(argv)
		if arg == "" || inRuntimeDir(arg, ours) || !ours[f.processRuntimeDir(pid)] {
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

// inRuntimeDir reports whether arg is a kernel-*.json file of one of the
// runtime dirs, which Discover reads from the dir itself: its process's
// environment need not be read (a server's kernels are most of them).
func inRuntimeDir(arg string, dirs map[string]bool) bool {
	name := filepath.Base(arg)
	return filepath.IsAbs(arg) && dirs[filepath.Dir(filepath.Clean(arg))] &&
		strings.HasPrefix(name, "kernel-") && strings.HasSuffix(name, ".json")
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
func addLaunchedKernels(res *Result, lister ConnectionFileLister, runtimeDirs []string, seenFile map[string]bool, cache *KernelFiles) {
	files, err := lister.LaunchedConnectionFiles(runtimeDirs)
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
		k, err := cache.read(file)
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

// processRuntimeDir is the Jupyter runtime dir process pid would use, from
// its environment (readable by its user or root); "" when unreadable.
func (f *ProcFinder) processRuntimeDir(pid int) string {
	data, _, err := safefile.Read(filepath.Join(f.procRoot(), strconv.Itoa(pid), "environ"), 1<<20)
	if err != nil {
		return ""
	}
	env := map[string]string{}
	for _, kv := range strings.Split(string(data), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	if env["JUPYTER_RUNTIME_DIR"] == "" && env["XDG_DATA_HOME"] == "" && env["HOME"] == "" {
		return "" // defaultRuntimeDir would fall back to our own home
	}
	return filepath.Clean(defaultRuntimeDir(func(k string) string { return env[k] }))
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
