package discovery

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/safefile"
)

var testInfo = safefile.Info{UID: 1000, Dev: 1, Ino: 2, DirUID: 1000}

const goodConn = `{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`

func problemsText(res Result) string {
	var all []string
	for _, p := range res.Problems {
		all = append(all, p.Error())
	}
	return strings.Join(all, "\n")
}

// A connection file read empty while its kernel writes it, then written,
// is never a problem: ipykernel rewrites its file at every start.
func TestKernelFileEmptyThenWritten(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kernel-starting.json")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var c KernelFiles
	opts := Options{RuntimeDirs: []string{dir}, KernelFiles: &c}
	for range 2 {
		res := Discover(context.Background(), opts)
		if len(res.Problems) != 0 || len(res.Kernels) != 0 {
			t.Fatalf("a file being written: kernels %+v, problems:\n%s", res.Kernels, problemsText(res))
		}
	}
	if err := os.WriteFile(path, []byte(goodConn), 0o600); err != nil {
		t.Fatal(err)
	}
	res := Discover(context.Background(), opts)
	if len(res.Problems) != 0 || len(res.Kernels) != 1 || res.Kernels[0].ID != "starting" {
		t.Fatalf("once written: kernels %+v, problems:\n%s", res.Kernels, problemsText(res))
	}
	if len(c.broken) != 0 {
		t.Errorf("a file that parses is still remembered as broken: %v", c.broken)
	}
}

// A file that stays unparsable is told once, after it stayed so over
// brokenSettle and two scans; then again only when its bytes change. The
// good file beside it is listed at every scan.
func TestKernelFileStaysBroken(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "kernel-junk.json")
	if err := os.WriteFile(junk, []byte(`{"shell_port": `), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kernel-good.json"), []byte(goodConn), 0o600); err != nil {
		t.Fatal(err)
	}
	var c KernelFiles
	opts := Options{RuntimeDirs: []string{dir}, KernelFiles: &c}
	told := 0
	deadline := time.Now().Add(10 * brokenSettle)
	for told == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a file broken for %s was never told", 10*brokenSettle)
		}
		res := Discover(context.Background(), opts)
		if len(res.Kernels) != 1 {
			t.Fatalf("kernels = %+v, want the good one", res.Kernels)
		}
		for _, p := range res.Problems {
			if !strings.Contains(p.Error(), "kernel-junk.json") || !strings.Contains(p.Error(), "invalid JSON") {
				t.Fatalf("unexpected problem %v", p)
			}
			told++
		}
		time.Sleep(50 * time.Millisecond) // the rescan's interval, not a wait for a state
	}
	first := time.Now()
	for range 3 {
		if res := Discover(context.Background(), opts); len(res.Problems) != 0 {
			t.Fatalf("told again at a later scan:\n%s", problemsText(res))
		}
	}
	if err := os.WriteFile(junk, []byte(`not json`), 0o600); err != nil {
		t.Fatal(err)
	}
	for {
		res := Discover(context.Background(), opts)
		if len(res.Problems) > 0 {
			if s := problemsText(res); !strings.Contains(s, "not a JSON object") {
				t.Fatalf("new content: %s", s)
			}
			break
		}
		if time.Since(first) > 10*brokenSettle {
			t.Fatal("new broken content never told")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// settle counts scans and time on its own: one scan, or two within
// brokenSettle, is not enough.
func TestSettle(t *testing.T) {
	var c KernelFiles
	t0 := time.Now()
	bad := errors.New("bad")
	steps := []struct {
		data string
		at   time.Duration
		told bool
	}{
		{"x", 0, false},
		{"x", brokenSettle / 2, false},
		{"x", brokenSettle, true},
		{"x", 2 * brokenSettle, false}, // told already
		{"y", 3 * brokenSettle, false}, // new content starts anew
		{"y", 5 * brokenSettle, true},
	}
	for i, s := range steps {
		err := c.settle("/r/kernel-a.json", []byte(s.data), testInfo, bad, t0.Add(s.at))
		if got := !errors.Is(err, errSettling); got != s.told {
			t.Errorf("step %d (%q at %s): told %v, want %v (%v)", i, s.data, s.at, got, s.told, err)
		}
	}
}

type namingFinder map[string]Owner

func (n namingFinder) FindKernels(files []KernelFile) (map[string]Owner, error) {
	out := map[string]Owner{}
	for _, kf := range files {
		if o, ok := n[kf.Path]; ok && kf.Unparsed {
			out[kf.Path] = o
		}
	}
	return out, nil
}

// Restarting the kernel is advised only when a live kernel of the file's
// owner names the file; a file no process names is left over.
func TestBrokenAdvice(t *testing.T) {
	dir := t.TempDir()
	named := filepath.Join(dir, "kernel-named.json")
	orphan := filepath.Join(dir, "kernel-orphan.json")
	for _, p := range []string{named, orphan} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pf := namingFinder{named: {PID: 4242, UIDMatch: true, Flagged: true},
		orphan: {PID: 99, UIDMatch: false, Flagged: true}} // another user's process
	res := Discover(context.Background(), Options{RuntimeDirs: []string{dir}, Procs: pf})
	if len(res.Problems) != 2 {
		t.Fatalf("problems:\n%s", problemsText(res))
	}
	for _, p := range res.Problems {
		s := p.Error()
		switch {
		case strings.Contains(s, "kernel-named.json"):
			if !strings.Contains(s, "pid 4242") || !strings.Contains(s, "restart the kernel to rewrite it") {
				t.Errorf("named file: %s", s)
			}
		case strings.Contains(s, "kernel-orphan.json"):
			if strings.Contains(s, "restart") || !strings.Contains(s, "no running kernel names it") {
				t.Errorf("orphan file: %s", s)
			}
		default:
			t.Errorf("unexpected problem %s", s)
		}
		if !strings.Contains(s, "empty") {
			t.Errorf("problem does not say what is wrong: %s", s)
		}
	}
}

// A port owner that does not name the file judged is not a problem when
// the file was rewritten since (a kernel restarting names the new one).
func TestRewritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kernel-r.json")
	if err := os.WriteFile(path, []byte(goodConn), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := ReadKernelFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rewritten(k) {
		t.Fatal("the file read is taken for rewritten")
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(goodConn), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if !rewritten(k) {
		t.Error("a file replaced by another is not taken for rewritten")
	}
}

// A file written in place (jupyter_client), emptied at each restart and
// written back with the same bytes: each empty read starts anew, never
// adding up to a file that stayed broken.
func TestKernelFileRewrittenInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kernel-inplace.json")
	write := func(data string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600) // same inode
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var c KernelFiles
	for range 3 {
		write("")
		if _, err := c.read(path); !errors.Is(err, errSettling) {
			t.Fatalf("an empty read: %v, want it settling", err)
		}
		if b := c.broken[path]; b == nil || b.scans != 1 {
			t.Fatalf("an empty read after the file parsed continues an old one: %+v", b)
		}
		write(goodConn)
		if _, err := c.read(path); err != nil {
			t.Fatal(err)
		}
		if _, ok := c.broken[path]; ok {
			t.Fatal("a file that parses is still remembered as broken")
		}
	}
}
