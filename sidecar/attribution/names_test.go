package attribution

import "testing"

// The one name of a kernel every face shows: its notebook's file name,
// else its id's first 8 characters (never a rune cut in two).
func TestKernelName(t *testing.T) {
	for _, c := range []struct{ name, notebook, kernelID, want string }{
		{"path", "/home/alice/train.ipynb", "4c1f2e0a-6b7d", "train.ipynb"},
		{"relative path", "work/eval.ipynb", "4c1f2e0a", "eval.ipynb"},
		{"file name only", "train.ipynb", "4c1f2e0a", "train.ipynb"},
		{"no notebook", "", "4c1f2e0a-6b7d-4e21-9a3c-1d2e3f405162", "kernel 4c1f2e0a"},
		{"short id", "", "k2", "kernel k2"},
		{"multibyte id", "", "ключ-ядра-1", "kernel ключ-ядр"},
	} {
		if got := KernelName(c.notebook, c.kernelID); got != c.want {
			t.Errorf("%s: KernelName(%q, %q) = %q, want %q", c.name, c.notebook, c.kernelID, got, c.want)
		}
	}
}

// Finish names every notebook, and its holders and cull headline by the
// same name.
func TestFinishDisplayNames(t *testing.T) {
	rep := finishReport()
	Finish(&rep, FinishInput{Culls: []CullWarning{{KernelID: "c", ConnectionFile: "/c.json", User: "bob", Warning: 1,
		Action: CullReport, Bytes: 9 << 30}}})
	want := map[string]string{"a": "secret.ipynb", "b": "b.ipynb", "c": "kernel c", "d": "idle.ipynb"}
	for _, nb := range rep.Notebooks {
		if nb.DisplayName != want[nb.KernelID] {
			t.Errorf("notebook %s: display name %q, want %q", nb.KernelID, nb.DisplayName, want[nb.KernelID])
		}
	}
	for _, g := range rep.GPUs {
		for _, h := range g.Holders {
			if h.Kind == HolderNotebook && h.Name != want[h.KernelID] {
				t.Errorf("GPU %d holder %s named %q, want %q", g.Index, h.KernelID, h.Name, want[h.KernelID])
			}
		}
	}
	if len(rep.Alerts) != 1 || rep.Alerts[0].Headline[:len("kernel c holds")] != "kernel c holds" {
		t.Errorf("cull alert %+v, want its headline to name kernel c", rep.Alerts)
	}
}
