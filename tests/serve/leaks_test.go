package serve

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// runNotebookPy runs a notebook with nbclient, as a scheduled job does, on
// a kernel whose connection file is in the runtime dir gpumem serve
// watches. It prints the kernel id, waits for the file argv[3] (the test
// creates it once the daemon has injected the magics), then executes every
// cell and writes the executed notebook to argv[4].
const runNotebookPy = `import os, sys, time, uuid
import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient

nb_path, runtime, go_file, out_path = sys.argv[1:5]
kid = str(uuid.uuid4())
km = KernelManager(kernel_name="python3", connection_file=os.path.join(runtime, "kernel-%s.json" % kid))
km.start_kernel(cwd=os.path.dirname(nb_path))
print(kid, flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(go_file):
    if time.monotonic() > deadline:
        sys.exit("no go from the test")
    time.sleep(0.02)
nb = nbformat.read(nb_path, as_version=4)
try:
    NotebookClient(nb, km=km, timeout=300, resources={"metadata": {"path": os.path.dirname(nb_path)}}).execute()
finally:
    nbformat.write(nb, out_path)
    km.shutdown_kernel(now=True)
`

// TestLeaksNotebookWithServe: examples/leaks.ipynb runs top to bottom under
// nbclient with %gpumem injected by gpumem serve (its loader cell then
// loads nothing): no cell fails but the one tagged raises-exception, and
// every %gpumem cell shows gpumem's output.
func TestLeaksNotebookWithServe(t *testing.T) {
	testenv.Require(t, "ipykernel", "jupyter_client", "nbclient", "torch")
	dir := t.TempDir()
	runtime := filepath.Join(dir, "runtime")
	if err := os.MkdirAll(runtime, 0o700); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "examples", "leaks.ipynb"))
	if err != nil {
		t.Fatal(err)
	}
	// A copy away from the checkout: the loader cell, if it ran, would find
	// no magics source beside it and fail.
	nbPath := filepath.Join(dir, "work", "leaks.ipynb")
	if err := os.MkdirAll(filepath.Dir(nbPath), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nbPath, src, 0o600); err != nil {
		t.Fatal(err)
	}
	srvLike := &testenv.Server{Dir: dir}
	d := startDaemon(t, srvLike, testenv.NewFakeGPU(t))

	goFile, outPath := filepath.Join(dir, "go"), filepath.Join(dir, "executed.ipynb")
	p := testenv.Start(t, testenv.Env(dir), dir, testenv.Python(), "-c", runNotebookPy, nbPath, runtime, goFile, outPath)
	var kid string
	testenv.Poll(t, 60*time.Second, "the job's kernel", func() bool {
		if p.Exited() {
			t.Fatalf("the nbclient job exited early:\n%s", p.Output())
		}
		line, _, _ := strings.Cut(p.Output(), "\n")
		if len(line) == 36 && strings.Count(line, "-") == 4 {
			kid = line
			return true
		}
		return false
	})
	testenv.Poll(t, 60*time.Second, "gpumem serve to inject the magics into the job's kernel", func() bool {
		_, ok := d.FindLog("magics injected", map[string]any{"kernel_id": kid})
		return ok
	})
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testenv.Poll(t, 300*time.Second, "the notebook to run", p.Exited)
	t.Logf("examples/leaks.ipynb ran in %v", time.Since(start).Round(time.Millisecond))
	if code := p.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("nbclient job: exit %d\n%s", code, p.Output())
	}

	var nb struct {
		Cells []struct {
			CellType string                  `json:"cell_type"`
			Source   any                     `json:"source"`
			Metadata struct{ Tags []string } `json:"metadata"`
			Outputs  []struct {
				OutputType string                     `json:"output_type"`
				Data       map[string]json.RawMessage `json:"data"`
				EName      string                     `json:"ename"`
			} `json:"outputs"`
		} `json:"cells"`
	}
	b, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &nb); err != nil {
		t.Fatal(err)
	}
	magicCells := 0
	for i, c := range nb.Cells {
		if c.CellType != "code" {
			continue
		}
		src := sourceText(c.Source)
		raises := false
		for _, tag := range c.Metadata.Tags {
			raises = raises || tag == "raises-exception"
		}
		var errs []string
		gpumemOut := false
		for _, o := range c.Outputs {
			if o.OutputType == "error" {
				errs = append(errs, o.EName)
			}
			if _, ok := o.Data["application/vnd.gpumem.v1+json"]; ok {
				gpumemOut = true
			}
		}
		if raises != (len(errs) > 0) {
			t.Errorf("cell %d (%.40q): errors %v, tagged raises-exception %v", i, src, errs, raises)
		}
		if strings.HasPrefix(src, "%gpumem") || strings.Contains(src, "\n%gpumem") || strings.HasPrefix(src, "%%gpumem") {
			magicCells++
			if !gpumemOut {
				t.Errorf("cell %d (%.40q): no gpumem output", i, src)
			}
		}
	}
	if magicCells < 5 {
		t.Errorf("only %d %%gpumem cells ran", magicCells)
	}
}

func sourceText(src any) string {
	switch s := src.(type) {
	case string:
		return s
	case []any:
		var b strings.Builder
		for _, l := range s {
			if str, ok := l.(string); ok {
				b.WriteString(str)
			}
		}
		return b.String()
	}
	return ""
}
