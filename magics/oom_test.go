package magics_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/magics"
)

// errorOutput is a cell's error output: what IPython showed.
type errorOutput struct {
	EName     string   `json:"ename"`
	EValue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

func errorOf(t *testing.T, r testenv.FrontendReply) errorOutput {
	t.Helper()
	for _, o := range r.Outputs {
		if o.Type == "error" {
			var e errorOutput
			if err := json.Unmarshal(o.Content, &e); err != nil {
				t.Fatal(err)
			}
			return e
		}
	}
	t.Fatalf("no error output: %s", r.Text())
	return errorOutput{}
}

// TestOOMReportInKernel: in a real kernel without gpumem serve, a cell
// raising CuPy's error (a class named and placed as CuPy's is) gets the
// report under its traceback, saying it is what the kernel alone knows.
// The traceback is the one a kernel without gpumem shows; when building
// the report fails, one line says so and the traceback is still the same.
func TestOOMReportInKernel(t *testing.T) {
	plain := newSession(t)
	s := newSession(t)
	s.inject(magics.InjectOptions{})
	const def = `OutOfMemoryError = type("OutOfMemoryError", (MemoryError,), {"__module__": "cupy.cuda.memory"})
def alloc(n):
    raise OutOfMemoryError("Out of memory allocating {:,} bytes (allocated so far: 0 bytes).".format(n))`
	const raise = "alloc(3 << 30)"
	plain.cell(def, true)
	s.cell(def, true)
	want := errorOf(t, plain.cell(raise, false))

	r := s.cell(raise, false)
	if got := errorOf(t, r); !reflect.DeepEqual(got, want) {
		t.Errorf("the traceback with gpumem differs:\n got %+v\nwant %+v", got, want)
	}
	var data struct {
		Kind     string `json:"kind"`
		NoDaemon bool   `json:"no_daemon"`
		Request  struct {
			Framework      string `json:"framework"`
			RequestedBytes uint64 `json:"requested_bytes"`
		} `json:"request"`
	}
	if !r.Data("application/vnd.gpumem.v1+json", &data) || data.Kind != "oom" || !data.NoDaemon ||
		data.Request.Framework != "cupy" || data.Request.RequestedBytes != 3<<30 {
		t.Fatalf("report data %+v:\n%s", data, r.Text())
	}
	text := r.Text()
	for _, w := range []string{"gpumem: out of memory in cell [", "line 1: alloc(3 << 30)",
		"asked for 3.0 GiB (cupy.cuda.memory.OutOfMemoryError)", "this is what the kernel alone knows"} {
		if !strings.Contains(text, w) {
			t.Errorf("report lacks %q:\n%s", w, text)
		}
	}

	// A report that fails to build: one line, the same traceback (the
	// plain kernel runs as many cells, for the same execution count).
	s.cell(`__import__("sys").modules["_gpumem_magics"].oom.kernel_figures = lambda *a: 1 / 0`, true)
	plain.cell("pass", true)
	want = errorOf(t, plain.cell(raise, false))
	r = s.cell(raise, false)
	if got := errorOf(t, r); !reflect.DeepEqual(got, want) {
		t.Errorf("the traceback after a failed report differs:\n got %+v\nwant %+v", got, want)
	}
	var lines []string
	for _, l := range strings.Split(r.Text(), "\n") {
		if strings.Contains(l, "gpumem") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || lines[0] != "gpumem: could not build the out-of-memory report (ZeroDivisionError: division by zero)" {
		t.Errorf("a failed report printed %q", lines)
	}
	// IPython's own record of the error is the user's.
	var last string
	s.probe(`import sys, json; print(json.dumps(type(sys.last_value).__name__))`, &last)
	if last != "OutOfMemoryError" {
		t.Errorf("sys.last_value is a %s", last)
	}
}
