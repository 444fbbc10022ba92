package cli

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpumem/gpumem/sidecar/discovery"
)

// TestKernelAlertFile: attach tells a kernel the alert file gpumem serve
// tells it: a private daemon's (socket 0600) one file beside the socket, a
// shared daemon's (socket 0666) file of the kernel's user, the owner of its
// connection file.
func TestKernelAlertFile(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "gpumem.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	conn := filepath.Join(dir, "kernel-k1.json")
	if err := os.WriteFile(conn, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	owner := os.Geteuid()
	if owner == 0 { // as root: a user's kernel, not the caller's
		owner = 4242
		if err := os.Chown(conn, owner, -1); err != nil {
			t.Fatal(err)
		}
	}
	k := discovery.Kernel{ID: "k1", ConnectionFile: conn}
	for _, tc := range []struct {
		mode os.FileMode
		want string
	}{
		{0o600, filepath.Join(dir, "gpumem-alerts.json")},
		{0o666, filepath.Join(dir, "gpumem-alerts", fmt.Sprint(owner)+".json")},
	} {
		if err := os.Chmod(sock, tc.mode); err != nil {
			t.Fatal(err)
		}
		if got := kernelAlertFile(sock, k); got != tc.want {
			t.Errorf("socket %v: %s, want %s", tc.mode, got, tc.want)
		}
	}
}
