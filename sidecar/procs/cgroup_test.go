package procs

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

func TestCgroupFixture(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const cgroup = "0::/kubepods/besteffort/pod5b7e3c1a-2f4d-4e6b-9a8c-0d1e2f3a4b5c/4f0d2e8a9b1c3d5e7f60718293a4b5c6d7e8f90123456789abcdef0123456789\n"
	stat := "42 (python3) S 1 42 42 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0 0\n"
	for name, content := range map[string]string{"cgroup": cgroup, "stat": stat} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs := &FS{Root: root}
	for _, start := range []uint64{777, 0} {
		got, err := fs.Cgroup(42, start)
		if err != nil || string(got) != cgroup {
			t.Errorf("Cgroup(42, %d) = %q, %v; want the file", start, got, err)
		}
	}
	if _, err := fs.Cgroup(42, 778); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("Cgroup with another start time: %v, want ESRCH", err)
	}
	if _, err := fs.Cgroup(43, 0); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("Cgroup of a missing pid: %v, want ENOENT", err)
	}
}

// TestCgroupReal reads this test's own cgroup from the real /proc.
func TestCgroupReal(t *testing.T) {
	fs := &FS{}
	pid := os.Getpid()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	st, err := parseStat(data)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fs.Cgroup(pid, st.StartTime)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("Cgroup(self) = %q, want %q", got, want)
	}
}
