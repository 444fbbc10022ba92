package magics_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// checkGolden compares got with testdata/name (rewriting it with -update).
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./magics -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (go test ./magics -update rewrites it):\n--- got ---\n%s\n--- want ---\n%s", path, got, want)
	}
}

func remarshal(t testing.TB, in any, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	remarshalBytes(t, b, out)
}

func remarshalBytes(t testing.TB, b []byte, out any) {
	t.Helper()
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

// renderPy renders data dicts with the package's render module (py/, the
// files that are embedded), in a plain python3: no kernel, no IPython
// needed. It returns name -> [text, html].
func renderPy(t *testing.T, fixtures map[string]json.RawMessage) map[string][2]string {
	t.Helper()
	const driver = `import json, sys
from gpumem_magics import render
req = json.load(sys.stdin)
out = {}
for name, data in req["fixtures"].items():
    out[name] = list(render.render(data))
sys.stdout.write(json.dumps(out))`
	in, err := json.Marshal(map[string]any{"fixtures": fixtures})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testenv.Python(), "-c", driver)
	cmd.Env = append(os.Environ(), "PYTHONPATH=py", "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render in python: %v\n%s", err, stderr.String())
	}
	var res map[string][2]string
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("render output: %v", err)
	}
	return res
}

func loadFixtures(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "render", "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures in testdata/render: %v", err)
	}
	fx := map[string]json.RawMessage{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(b) {
			t.Fatalf("%s: invalid JSON", p)
		}
		fx[strings.TrimSuffix(filepath.Base(p), ".json")] = b
	}
	return fx
}

// TestRenderGolden: every magic's text/plain and HTML for fixed data dicts
// (testdata/render/*.json) against golden files. The HTML must also be
// well-formed (parsed as XML).
func TestRenderGolden(t *testing.T) {
	fx := loadFixtures(t)
	got := renderPy(t, fx)
	names := make([]string, 0, len(fx))
	for n := range fx {
		names = append(names, n)
	}
	sort.Strings(names)
	kinds := map[string]bool{}
	for _, name := range names {
		r, ok := got[name]
		if !ok {
			t.Errorf("%s: not rendered", name)
			continue
		}
		var head struct{ Kind string }
		remarshalBytes(t, fx[name], &head)
		kinds[head.Kind] = true
		checkGolden(t, filepath.Join("render", name+".txt"), r[0]+"\n")
		checkGolden(t, filepath.Join("render", name+".html"), r[1]+"\n")
		if err := wellFormed(r[1]); err != nil {
			t.Errorf("%s: HTML not well-formed: %v", name, err)
		}
	}
	for _, k := range []string{"summary", "vars", "free", "cell", "help", "error"} {
		if !kinds[k] {
			t.Errorf("no fixture of kind %q", k)
		}
	}
}

func wellFormed(s string) error {
	d := xml.NewDecoder(strings.NewReader("<root>" + s + "</root>"))
	d.Strict = true
	for {
		_, err := d.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
