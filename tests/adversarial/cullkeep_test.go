package adversarial

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// "Keep it" on a cull warning: the kernel's user keeps it, the warning is
// withdrawn as kept, and the keep counts as use: the kernel, left idle, is
// warned again only --cull-idle after the keep, and is not shut down in
// between. (A minute's warning: the keep always comes within it.)
func TestCullKeepItCountsAsUse(t *testing.T) {
	t.Parallel()
	r := startCullRig(t, "shutdown", "--cull-warn=1m")
	r.d.WaitLog(t, 30*time.Second, "idle kernel holds GPU memory: warned", map[string]any{"kernel_id": r.id})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	from := r.d.LogCount()
	reply, err := r.d.Client.Keep(ctx, r.id)
	if err != nil {
		t.Fatalf("keep: %v", err)
	}
	if !strings.Contains(reply.Text, "long.ipynb") || !strings.Contains(reply.Text, "after 3 s idle") {
		t.Errorf("keep's sentence %q names no notebook or idle time", reply.Text)
	}
	r.d.WaitLogSince(t, 10*time.Second, from, "cull cancelled", map[string]any{"kernel_id": r.id, "reason": "kept by its user"})
	if !r.listed(t) || !testenv.Alive(r.pid) {
		t.Error("the kept kernel is gone")
	}
	again := r.d.WaitLogSince(t, 30*time.Second, from, "idle kernel holds GPU memory: warned", map[string]any{"kernel_id": r.id})
	if idle := again.At.Sub(reply.KeptAt); idle < 3*time.Second {
		t.Errorf("warned again %v after the keep, before --cull-idle (3 s): the keep did not count as use", idle)
	}
	for _, l := range r.d.LogsSince(from) {
		if l.At.Before(again.At) && strings.Contains(fmt.Sprint(l.Fields["message"]), "shut down") {
			t.Errorf("the kept kernel was shut down: %v", l.Fields)
		}
	}
}
