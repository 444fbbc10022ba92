package discovery

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testConnFile is a connection file's bytes with shell port port.
func testConnFile(port int) []byte {
	return []byte(`{"transport":"tcp","ip":"127.0.0.1","shell_port":` + strconv.Itoa(port) +
		`,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`)
}

// KernelFiles parses a file again when its bytes change, and never answers
// from memory for a file that would now be refused: a link in its place,
// or a file of another user in a user's dir.
func TestKernelFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kernel-abc.json")
	if err := os.WriteFile(path, testConnFile(1000), 0o600); err != nil {
		t.Fatal(err)
	}
	var c KernelFiles
	for range 2 {
		k, err := c.read(path)
		if err != nil || k.Connection.ShellPort != 1000 || k.ID != "abc" {
			t.Fatalf("read: %+v, %v", k, err)
		}
	}
	if err := os.WriteFile(path, testConnFile(2000), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, err := c.read(path); err != nil || k.Connection.ShellPort != 2000 {
		t.Errorf("after a rewrite: %+v, %v; want port 2000", k, err)
	}
	other := filepath.Join(dir, "other.json")
	if err := os.WriteFile(other, testConnFile(2000), 0o600); err != nil {
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
	if err := os.WriteFile(path, testConnFile(2000), 0o600); err != nil {
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

// A file remembered with a settled stamp (read over a second after its
// last write, so answered from a stat) is read again once it changes:
// other bytes of the same size, written in place.
func TestKernelFilesStamped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kernel-abc.json")
	if err := os.WriteFile(path, testConnFile(1000), 0o600); err != nil {
		t.Fatal(err)
	}
	var c KernelFiles
	deadline := time.Now().Add(10 * time.Second)
	for {
		k, err := c.read(path)
		if err != nil || k.Connection.ShellPort != 1000 {
			t.Fatalf("read: %+v, %v", k, err)
		}
		c.mu.Lock()
		f := c.files[path]
		c.mu.Unlock()
		if f.stamp.Unchanged(path) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the file's stamp did not settle in 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if k, ok := c.unchanged(path, time.Now()); !ok || k.Connection.ShellPort != 1000 {
		t.Fatalf("a settled, untouched file: answered %v, %+v; want it from memory", ok, k)
	}
	if _, ok := c.unchanged(path, time.Now().Add(rereadEvery)); ok {
		t.Error("a file remembered for rereadEvery: answered from memory, want it read")
	}
	if err := os.WriteFile(path, testConnFile(2000), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, err := c.read(path); err != nil || k.Connection.ShellPort != 2000 {
		t.Errorf("after a rewrite of the same size: %+v, %v; want port 2000", k, err)
	}
}

// BenchmarkKernelFilesRescan is a daemon's safety-net rescan of a host's
// connection files, every one unchanged since the last: answered from the
// stamps (a stat of each file and its dir), against each file read again
// and its bytes compared (what a rescan did before stamps, and does for a
// file once every rereadEvery).
func BenchmarkKernelFilesRescan(b *testing.B) {
	dir := b.TempDir()
	const n = 1000
	paths := make([]string, n)
	for i := range paths {
		paths[i] = filepath.Join(dir, "kernel-"+strconv.Itoa(i)+".json")
		data := []byte(`{"transport":"tcp","ip":"127.0.0.1","shell_port":` + strconv.Itoa(10000+i) +
			`,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"a0b1c2d3-e4f5a6b7c8d9e0f1a2b3c4d5","signature_scheme":"hmac-sha256","kernel_name":"python3"}`)
		if err := os.WriteFile(paths[i], data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	var c KernelFiles
	// Until every stamp settles (a second after the writes).
	deadline := time.Now().Add(10 * time.Second)
	for settled := 0; settled < n; {
		settled = 0
		for _, p := range paths {
			if _, err := c.read(p); err != nil {
				b.Fatal(err)
			}
			if _, ok := c.unchanged(p, time.Now()); ok {
				settled++
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d stamps settled in 10 s", settled, n)
		}
	}
	rescan := func(b *testing.B, forget bool) {
		for b.Loop() {
			if forget {
				c.mu.Lock()
				for p, f := range c.files {
					f.readAt = time.Time{}
					c.files[p] = f
				}
				c.mu.Unlock()
			}
			for _, p := range paths {
				if _, err := c.read(p); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("stamped", func(b *testing.B) { rescan(b, false) })
	b.Run("read", func(b *testing.B) { rescan(b, true) })
}
