package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A write that keeps failing fails with the same text each time (the
// warning's rate limit matches on it) naming the file, never the random
// temporary name, and leaves no temporary file behind.
func TestWriteFileAtomicErrorIsStable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gpumem-alerts.json")
	// A non-empty directory in the file's place: every rename fails.
	if err := os.MkdirAll(filepath.Join(path, "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for range 3 {
		err := writeFileAtomic(path, []byte(`{"alerts":[]}`), 0o600)
		if err == nil {
			t.Fatal("writing over a non-empty directory succeeded")
		}
		if !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.EISDIR) && !errors.Is(err, syscall.ENOTEMPTY) {
			t.Errorf("the system's reason is lost: %v", err)
		}
		msgs = append(msgs, err.Error())
	}
	if msgs[0] != msgs[1] || msgs[1] != msgs[2] {
		t.Errorf("the same failure reads differently each time: %q", msgs)
	}
	if !strings.HasPrefix(msgs[0], path+": rename into place: ") || strings.Contains(msgs[0], "."+filepath.Base(path)+".") {
		t.Errorf("error %q: want the file and the step, not the temporary name", msgs[0])
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}
