package discovery

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// KernelFiles parses a file again when its bytes change, and never answers
// from memory for a file that would now be refused: a link in its place,
// or a file of another user in a user's dir.
func TestKernelFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kernel-abc.json")
	conn := func(port int) []byte {
		return []byte(`{"transport":"tcp","ip":"127.0.0.1","shell_port":` + strconv.Itoa(port) +
			`,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`)
	}
	if err := os.WriteFile(path, conn(1000), 0o600); err != nil {
		t.Fatal(err)
	}
	var c KernelFiles
	for range 2 {
		k, err := c.read(path)
		if err != nil || k.Connection.ShellPort != 1000 || k.ID != "abc" {
			t.Fatalf("read: %+v, %v", k, err)
		}
	}
	if err := os.WriteFile(path, conn(2000), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, err := c.read(path); err != nil || k.Connection.ShellPort != 2000 {
		t.Errorf("after a rewrite: %+v, %v; want port 2000", k, err)
	}
	other := filepath.Join(dir, "other.json")
	if err := os.WriteFile(other, conn(2000), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, path); err != nil {
		t.Fatal(err)
	}
	if k, err := c.read(path); err == nil {
		t.Errorf("a link in the file's place, same bytes behind it: %+v, no error", k)
	}
	if os.Geteuid() != 0 {
		return
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, conn(2000), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.read(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if _, err := c.read(path); err == nil || !strings.Contains(err.Error(), "belongs to uid 0, but its dir to uid 4242") {
		t.Errorf("a file of another user than its dir's: %v, want it refused", err)
	}
}
