package attribution

import "path/filepath"

// kernelIDRunes is how much of a kernel's id names it where it has no
// notebook: enough for every command that takes an id's prefix.
const kernelIDRunes = 8

// KernelName is the name every face shows for a kernel (a notebook's
// DisplayName, and how a sentence about one kernel names it): its
// notebook's file name, else "kernel " and its id's first 8 characters.
// It is the one builder of that name; a face renders the report's.
func KernelName(notebook, kernelID string) string {
	if notebook != "" {
		return filepath.Base(notebook)
	}
	return "kernel " + cutRunes(kernelID, kernelIDRunes)
}

// addDisplayNames sets each notebook's DisplayName: first of the steps,
// since the holders and the alerts name notebooks by it.
func addDisplayNames(r *Report, _ FinishInput) {
	for i := range r.Notebooks {
		nb := &r.Notebooks[i]
		nb.DisplayName = KernelName(nb.Notebook, nb.KernelID)
	}
}
