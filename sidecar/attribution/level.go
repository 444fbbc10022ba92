package attribution

import (
	"fmt"

	"github.com/gpumem/gpumem/internal/units"
)

// GPU levels: how full a GPU is, as every face colours it.
const (
	LevelOK     = "ok"
	LevelWarn   = "warn"   // at or over the alert threshold
	LevelDanger = "danger" // over DangerRatio of its memory, whatever the threshold
)

// DangerRatio is the danger line, a fraction of a GPU's memory: above it
// a GPU is LevelDanger even with alerts off.
const DangerRatio = 0.95

// LevelFor is g's level under the alert threshold (a fraction of its
// memory; 0 or less: alerts off): danger over DangerRatio, warn where a
// threshold alert stands (OverThreshold), else ok. A GPU whose total is
// unknown is ok.
func LevelFor(g GPU, threshold float64) string {
	switch {
	case g.MemoryTotalBytes == 0:
		return LevelOK
	case float64(g.MemoryUsedBytes) > DangerRatio*float64(g.MemoryTotalBytes):
		return LevelDanger
	case OverThreshold(g, threshold):
		return LevelWarn
	}
	return LevelOK
}

// addLevels sets each GPU's Level, and its UnderThreshold sentence where
// it has crossed the threshold before (in.Alerts.Episodes) and is under
// it now.
func addLevels(r *Report, in FinishInput) {
	for i := range r.GPUs {
		g := &r.GPUs[i]
		g.Level = LevelFor(*g, in.Alerts.Threshold)
		g.UnderThreshold = ""
		if in.Alerts.Threshold > 0 && in.Alerts.Episodes[g.Index] > 0 && !OverThreshold(*g, in.Alerts.Threshold) {
			g.UnderThreshold = underThresholdMessage(*g)
		}
	}
}

// underThresholdMessage is what a face says when g's threshold alert
// ends. Like every sentence of the report it is English: the faces show
// the daemon's sentences as they are.
func underThresholdMessage(g GPU) string {
	return fmt.Sprintf("GPU %d is back under the alert threshold: %s of %s used (%.0f%%).", g.Index,
		units.Bytes(g.MemoryUsedBytes), units.Bytes(g.MemoryTotalBytes), usedPercent(g))
}
