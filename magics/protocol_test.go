package magics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
)

// dial attaches gpumem's own protocol client to the session's kernel.
func dial(t testing.TB, s *session) *protocol.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := protocol.Dial(ctx, s.k.ConnectionFile, protocol.Options{})
	if err != nil {
		t.Fatalf("dial %s: %v", s.k.ConnectionFile, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestInjectThroughProtocolClient: what `gpumem attach` and `gpumem free`
// do: attach with protocol.Client, inject, run a free; the user's frontend
// then uses the magics.
func TestInjectThroughProtocolClient(t *testing.T) {
	testenv.Require(t, "torch")
	s := newSession(t)
	s.cell("import torch\na = torch.zeros(250)", true)
	s.cell("a", true)
	c := dial(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := magics.Inject(ctx, c, magics.InjectOptions{KernelID: s.k.ID})
	if err != nil || !res.Injected || res.Language != "python" || len(res.FrameworksLoaded) != 1 || res.FrameworksLoaded[0] != "torch" {
		t.Fatalf("inject through protocol.Client: %+v, %v", res, err)
	}
	if !strings.Contains(res.String(), "frameworks loaded: torch") {
		t.Errorf("String(): %s", res.String())
	}
	st, err := magics.GetStatus(ctx, c)
	if err != nil || !st.Injected || st.Version != magics.Version() || st.PID != s.k.Cmd.Process.Pid {
		t.Fatalf("status: %+v, %v", st, err)
	}
	fr, err := magics.FreeCache(ctx, c, magics.FreeOptions{Vars: []string{"a"}})
	if err != nil || len(fr.Deleted) != 1 || fr.Deleted[0].Bytes != 1000 || fr.Deleted[0].Alive {
		t.Fatalf("free a: %+v, %v", fr, err)
	}
	if len(fr.Hidden) != 1 || !strings.HasPrefix(fr.Hidden[0].Ref, "Out[2]") {
		t.Errorf("free a should drop Out[2]: %+v", fr.Hidden)
	}
	data, _ := s.magic("%gpumem vars --all-devices")
	if rows, _ := data["rows"].([]any); len(rows) != 0 {
		t.Errorf("after free a, vars lists %v", rows)
	}
}
