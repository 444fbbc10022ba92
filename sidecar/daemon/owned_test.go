package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReconnectReadsOnlyTheOwnersFile: at a reconnect the connection file
// is read as discovery read it: a link in its place, or a file now of
// another uid (a hard link to someone else's), is not followed, and the
// client keeps the key it had.
func TestReconnectReadsOnlyTheOwnersFile(t *testing.T) {
	dir := t.TempDir()
	conn := `{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`
	file := filepath.Join(dir, "kernel-x.json")
	if err := os.WriteFile(file, []byte(conn), 0o600); err != nil {
		t.Fatal(err)
	}
	me := uint32(os.Geteuid())
	if info, err := ownedConnectionFile(me)(file); err != nil || info.Key != "k" {
		t.Fatalf("the owner's own file: %+v, %v", info, err)
	}
	if _, err := ownedConnectionFile(me + 1)(file); err == nil || !strings.Contains(err.Error(), "not followed") {
		t.Errorf("a file of another uid than when found: %v, want not followed", err)
	}
	link := filepath.Join(dir, "kernel-link.json")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	if _, err := ownedConnectionFile(me)(link); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a link: %v, want it refused", err)
	}
}
