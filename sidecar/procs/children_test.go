package procs

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseChildren(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    []int
		wantErr bool
	}{
		{"none", "", nil, false},
		{"one", "4242 ", []int{4242}, false},
		{"several", "10 11 12 ", []int{10, 11, 12}, false},
		{"newline", "7\n", []int{7}, false},
		{"garbage", "10 x1 ", nil, true},
		{"zero", "0 ", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseChildren([]byte(tc.in))
			if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
				t.Errorf("parseChildren(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// The real /proc: a child started here is listed, and a pid that is gone
// is an error wrapping fs.ErrNotExist.
func TestChildrenOfThisProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var fsys FS
	got, err := fsys.ChildrenOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, cmd.Process.Pid) {
		t.Errorf("ChildrenOf(self) = %v, want it to hold %d", got, cmd.Process.Pid)
	}
	if _, err := fsys.ChildrenOf(1 << 30); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ChildrenOf(a pid that is not) = %v, want fs.ErrNotExist", err)
	}
}

// Without task/*/children (CONFIG_PROC_CHILDREN off) the parents in every
// process's stat say it.
func TestChildrenOfByScan(t *testing.T) {
	root := t.TempDir()
	write := func(pid, stat string) {
		dir := filepath.Join(root, pid)
		if err := os.MkdirAll(filepath.Join(dir, "task", pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10", "10 (jupyter-lab) S 1 10 10 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0")
	write("11", "11 (python) S 10 11 11 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 101 0 0")
	write("12", "12 (gpumem) S 10 12 12 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 102 0 0")
	write("13", "13 (python) S 11 11 11 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 103 0 0")
	fsys := FS{Root: root}
	got, err := fsys.ChildrenOf(10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int{11, 12}) {
		t.Errorf("ChildrenOf(10) = %v, want [11 12]", got)
	}
}
