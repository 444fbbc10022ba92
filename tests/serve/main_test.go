// Package serve holds end-to-end scenarios of `gpumem serve`: the real
// binary against a real Notebook 6 server and real kernels, with a
// simulated-GPU file listing real pids.
package serve

import (
	"os"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
)

var gpumemBin string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithGpumem(m, "gpumem-serve-test", &gpumemBin))
}

// startDaemon runs gpumem serve on srv's runtime dir and waits until its
// API answers.
func startDaemon(t *testing.T, srv *testenv.Server, gpu *testenv.FakeGPU, args ...string) *testenv.Daemon {
	t.Helper()
	return testenv.StartDaemon(t, gpumemBin, srv.Dir, gpu, args...)
}

// tryStartDaemon starts gpumem serve on srv's runtime dir without waiting.
func tryStartDaemon(t *testing.T, srv *testenv.Server, gpu *testenv.FakeGPU, args ...string) *testenv.Daemon {
	t.Helper()
	return testenv.TryStartDaemon(t, gpumemBin, srv.Dir, gpu, args...)
}
