package history

import "testing"

// A reclaim's sentence, as every face shows it: the orphans counted, the
// notebook by its display name, the bytes, and what ended the kernel.
func TestReclaimMessage(t *testing.T) {
	for _, c := range []struct {
		notebook, kernelID, why string
		processes               int
		bytes                   uint64
		want                    string
	}{
		{"/w/train.ipynb", "abcdef0123", "restart", 2, 3435973837, "Ended 2 orphans of train.ipynb holding 3.2 GiB after the restart"},
		{"", "abcdef0123", "shutdown", 1, 1 << 30, "Ended 1 orphan of kernel abcdef01 holding 1.0 GiB after the shutdown"},
	} {
		if got := ReclaimMessage(c.notebook, c.kernelID, c.why, c.processes, c.bytes); got != c.want {
			t.Errorf("ReclaimMessage(%q, %q, %q, %d, %d) = %q, want %q", c.notebook, c.kernelID, c.why, c.processes, c.bytes, got, c.want)
		}
	}
}
