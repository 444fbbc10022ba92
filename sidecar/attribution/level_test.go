package attribution

import "testing"

// A GPU's level: danger over 95% whatever the threshold, warn at or over
// the threshold (as its alert), else ok; ok when its total is unknown.
func TestLevelFor(t *testing.T) {
	const total = 100 << 30
	for _, c := range []struct {
		name      string
		used      uint64
		total     uint64
		threshold float64
		want      string
	}{
		{"empty", 0, total, 0.8, LevelOK},
		{"under the threshold", 79 << 30, total, 0.8, LevelOK},
		{"at the threshold", 80 << 30, total, 0.8, LevelWarn},
		{"over the threshold", 90 << 30, total, 0.8, LevelWarn},
		{"at the danger line", 95 << 30, total, 0.8, LevelWarn},
		{"over the danger line", 96 << 30, total, 0.8, LevelDanger},
		{"full", total, total, 0.8, LevelDanger},
		{"alerts off", 90 << 30, total, 0, LevelOK},
		{"alerts off, over the danger line", 99 << 30, total, 0, LevelDanger},
		{"threshold over the danger line", 96 << 30, total, 0.99, LevelDanger},
		{"no total", 5 << 30, 0, 0.8, LevelOK},
	} {
		g := GPU{MemoryUsedBytes: c.used, MemoryTotalBytes: c.total}
		if got := LevelFor(g, c.threshold); got != c.want {
			t.Errorf("%s: LevelFor(%d of %d, %v) = %q, want %q", c.name, c.used, c.total, c.threshold, got, c.want)
		}
	}
}

// Finish sets each GPU's level from the alert threshold, and the sentence
// of a GPU back under it only where it crossed it before.
func TestFinishLevels(t *testing.T) {
	rep := finishReport() // GPU 0 at 70 of 80 GiB, GPU 1 at 9
	rep.GPUs = append(rep.GPUs, GPU{Index: 2, Name: "H200", MemoryTotalBytes: 80 << 30, MemoryUsedBytes: 79 << 30})
	Finish(&rep, FinishInput{Alerts: AlertConfig{Threshold: 0.8, Episodes: map[int]int{0: 1, 1: 2}}})
	want := []struct{ level, under string }{
		{LevelWarn, ""},
		{LevelOK, "GPU 1 is back under the alert threshold: 9.0 GiB of 80.0 GiB used (11%)."},
		{LevelDanger, ""},
	}
	for i, g := range rep.GPUs {
		if g.Level != want[i].level || g.UnderThreshold != want[i].under {
			t.Errorf("GPU %d: level %q, under %q; want %q, %q", g.Index, g.Level, g.UnderThreshold, want[i].level, want[i].under)
		}
	}
	// Alerts off: no sentence of a threshold, the danger line still.
	Finish(&rep, FinishInput{Alerts: AlertConfig{Episodes: map[int]int{1: 2}}})
	if g := rep.GPUs[1]; g.Level != LevelOK || g.UnderThreshold != "" {
		t.Errorf("alerts off: GPU 1 %q, %q", g.Level, g.UnderThreshold)
	}
	if g := rep.GPUs[0]; g.Level != LevelOK {
		t.Errorf("alerts off: GPU 0 at 87%%: %q, want ok", g.Level)
	}
}
