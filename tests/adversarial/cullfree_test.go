package adversarial

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// The cull's free has a deadline: on a SIGSTOPped kernel (idle, holding
// GPU memory, its server answering) it gives up and says so, instead of
// waiting until the kernel is continued; the daemon goes on serving.
func TestCullFreeOnStoppedKernel(t *testing.T) {
	t.Parallel()
	r := startCullRig(t, "free")
	if err := syscall.Kill(r.pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(r.pid, syscall.SIGCONT) })
	r.d.WaitLog(t, 30*time.Second, "idle kernel holds GPU memory: warned", map[string]any{"kernel_id": r.id})
	// Idle 3 s, warned 1 s, then the free's 30 s deadline.
	failed := r.d.WaitLog(t, 60*time.Second, "cull: free failed", map[string]any{"kernel_id": r.id, "error": "~deadline"})
	t.Logf("the free gave up: %v", failed["error"])
	if _, ok := r.d.FindLog("idle kernel's GPU caches freed", map[string]any{"kernel_id": r.id}); ok {
		t.Error("a stopped kernel's caches were reported freed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.d.Client.Healthz(ctx); err != nil {
		t.Errorf("the daemon stopped answering: %v", err)
	}
	if !testenv.Alive(r.pid) {
		t.Error("the stopped kernel was ended")
	}
}
