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
	"os"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
)

var gpumemBin string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithGpumem(m, "gpumem-hub-test", &gpumemBin))
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
