package discovery

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/safefile"
)

// A kernel that no server's session names may still say its notebook:
//   - JPY_SESSION_NAME in its environment: jupyter_server 2 sets it to the
//     notebook's absolute path (stale after a rename; jupyter_server 1 to a
//     path relative to its root, which is not used), VS Code's Jupyter
//     extension sets it too; nbclient, papermill, jupyter console and
//     KernelManager do not (measured: nbclient 0.11, papermill 2.7).
//   - papermill's command line: its kernel's parent is `papermill IN OUT`,
//     and IN is the notebook it runs.
// Both are read only for a proven kernel process, so a planted file cannot
// name a notebook.

// batchNamer is a ProcessFinder that can read a kernel's parent's argv.
type batchNamer interface {
	parentNotebook(ppid int) string
}

// nameNotebooks fills Notebook for proven kernels that have none.
func nameNotebooks(pf ProcessFinder, kernels []Kernel) {
	bn, _ := pf.(batchNamer)
	for i := range kernels {
		k := &kernels[i]
		if k.Notebook != "" || !k.PIDProven {
			continue
		}
		// jupyter_server 1 sets a path relative to its root (measured:
		// 1.23): nothing here anchors it, so it names nothing.
		if filepath.IsAbs(k.sessionName) {
			k.Notebook, k.NotebookFrom = k.sessionName, "JPY_SESSION_NAME"
			continue
		}
		if bn != nil && k.ppid > 1 {
			if nb := bn.parentNotebook(k.ppid); nb != "" {
				k.Notebook, k.NotebookFrom = nb, "papermill"
			}
		}
	}
}

// parentNotebook implements batchNamer: the input notebook of a papermill
// process (its first .ipynb argument), made absolute against its cwd; ""
// when ppid is not papermill.
func (f *ProcFinder) parentNotebook(ppid int) string {
	dir := filepath.Join(f.procRoot(), strconv.Itoa(ppid))
	data, _, err := safefile.Read(filepath.Join(dir, "cmdline"), 64<<10)
	if err != nil {
		return ""
	}
	argv := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
	return papermillInput(argv, func() string {
		cwd, _ := os.Readlink(filepath.Join(dir, "cwd"))
		return cwd
	})
}

// papermill options that take one or two values (papermill 2.x's CLI).
var papermillOptionValues = map[string]int{
	"-k": 1, "--kernel": 1, "-f": 1, "--parameters_file": 1, "-y": 1, "--parameters_yaml": 1,
	"-b": 1, "--parameters_base64": 1, "--cwd": 1, "--language": 1, "--engine": 1,
	"--start-timeout": 1, "--start_timeout": 1, "--execution-timeout": 1, "--log-level": 1,
	"-p": 2, "--parameters": 2, "-r": 2, "--parameters_raw": 2,
}

// papermillInput is the input notebook of a papermill command line
// (`papermill …`, `python -m papermill …`, `…/bin/papermill …`): its first
// positional argument, made absolute with cwd(). "" for any other command,
// and when the input is not a local .ipynb (a URL, "-" for stdin): the
// output path is never taken for it.
func papermillInput(argv []string, cwd func() string) string {
	start := -1
	for i, a := range argv {
		if filepath.Base(a) == "papermill" && (i == 0 || i == 1 || (i == 2 && argv[1] == "-m")) {
			start = i + 1
			break
		}
	}
	if start < 0 {
		return ""
	}
	for i := start; i < len(argv); i++ {
		a := argv[i]
		if strings.HasPrefix(a, "-") && a != "-" {
			if !strings.Contains(a, "=") {
				i += papermillOptionValues[a]
			}
			continue
		}
		if !strings.HasSuffix(a, ".ipynb") || strings.Contains(a, "://") {
			return ""
		}
		if !filepath.IsAbs(a) {
			c := cwd()
			if c == "" {
				return ""
			}
			a = filepath.Join(c, a)
		}
		return filepath.Clean(a)
	}
	return ""
}
