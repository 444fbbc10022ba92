package metrics

import (
	"io"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// gpumem_oom_total follows the notebook rule of every family: a notebook
// label only where the scrape may see notebooks (with PerNotebook, and in
// shared mode only with the token); the per-user count everywhere; label
// values others control escaped, never a panic.
func TestOOMCounterLabels(t *testing.T) {
	const token = "0123456789abcdef0123"
	hostile := "/home/alice/\x1b[2Jx\xff.ipynb"
	for _, c := range []struct {
		name        string
		perNotebook bool
		token       bool
	}{{"per notebook", true, false}, {"no notebooks", false, false}, {"shared, token", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			m := New(&fakeSource{snap: testSnapshot()}, zerolog.New(io.Discard), PerNotebook(c.perNotebook))
			if c.token {
				m.NotebooksOnlyWith(token)
			}
			m.AddOOM("/home/alice/a.ipynb", "alice", "0")
			m.AddOOM(hostile, "bob\xfe", "unknown")
			srv := serve(t, m.Handler(), "127.0.0.1:0", false)
			open := getWith(t, srv)
			withNotebooks := c.perNotebook && !c.token
			if c.token {
				full := getWith(t, srv, "Bearer "+token)
				if !strings.Contains(full.body, `gpumem_oom_total{gpu="0",notebook="/home/alice/a.ipynb",user="alice"} 1`) {
					t.Errorf("with the token, no per-notebook count:\n%s", full.body)
				}
			}
			if got := strings.Contains(open.body, `notebook="/home/alice/a.ipynb"`); got != withNotebooks {
				t.Errorf("notebook label shown: %v, want %v:\n%s", got, withNotebooks, open.body)
			}
			if !withNotebooks && !strings.Contains(open.body, `gpumem_oom_total{gpu="0",user="alice"} 1`) {
				t.Errorf("no per-user count:\n%s", open.body)
			}
			if withNotebooks && !strings.Contains(open.body, `notebook="/home/alice/\\x1b[2Jx\\xff.ipynb"`) {
				t.Errorf("the hostile notebook is not escaped:\n%s", open.body)
			}
			if !strings.Contains(open.body, `user="bob\\xfe"`) || !strings.Contains(open.body, "gpumem_sample_success 1") {
				t.Errorf("the hostile user's count or the other families are missing:\n%s", open.body)
			}
		})
	}
}
