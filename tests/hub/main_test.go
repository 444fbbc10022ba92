// Package hub holds end-to-end scenarios of `gpumem serve --all-users` on a
// shared host: a real JupyterHub (from the hashed lock, run as root) with
// configurable-http-proxy (from this folder's npm lock) spawning real
// JupyterLab single-user servers under two real system users made with
// useradd, their kernels listed in a simulated-GPU file.
//
// It needs root (useradd, the hub's spawner, the daemon). Under CI=true a
// missing part (root, JupyterHub, the proxy) fails; elsewhere it skips.
package hub

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

var gpumemBin string

func TestMain(m *testing.M) {
	// The users run the CLI too: the binary's dir must be theirs to enter.
	dir, err := os.MkdirTemp("", "gpumem-hub-test")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gpumemBin = filepath.Join(dir, "gpumem")
	build := exec.Command("go", "build", "-race", "-o", gpumemBin, "../../cmd/gpumem")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building gpumem:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// need fails under CI=true and skips elsewhere.
func need(t *testing.T, ok bool, msg string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
