package attribution

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/gpumem/gpumem/internal/units"
)

// Alert kinds.
const (
	// AlertThreshold: a GPU's used memory is at or over the alert
	// threshold.
	AlertThreshold = "threshold"
	// AlertCull: an idle kernel holding GPU memory will be culled unless
	// used.
	AlertCull = "cull"
	// AlertLeftRunning: reclaim left a dead kernel's process running
	// because it computes on a GPU (or could not be judged).
	AlertLeftRunning = "left_running"
	// AlertOOM: a kernel's last out-of-memory error, as the daemon
	// recorded it.
	AlertOOM = "oom"
)

// Cull actions, as culling's warnings name them.
const (
	CullReport   = "report"   // log and count only
	CullFree     = "free"     // cache-only free through the magics
	CullShutdown = "shutdown" // DELETE /api/kernels/{id} on its server
)

// Alert is one alert that stands: every face shows its Message, once per
// ID (a new crossing, a new warning is a new ID), and drops it when the
// report no longer holds it.
type Alert struct {
	ID   string `json:"id"`
	Kind string `json:"kind"` // AlertThreshold, AlertCull, AlertLeftRunning or AlertOOM
	GPU  int    `json:"gpu"`  // -1 for a kernel's own alert (a cull warning)
	// Kernels are the kernels it concerns: those using the GPU, or the
	// kernel warned.
	Kernels []string `json:"kernels"`
	// User owns a kernel's own alert; "" for a GPU's.
	User  string `json:"user,omitempty"`
	Bytes uint64 `json:"bytes"`
	// Deadline and Action: what culling will do, and when, unless the
	// kernel is used.
	Deadline time.Time `json:"deadline,omitzero"`
	Action   string    `json:"action,omitempty"`
	Message  string    `json:"message"`
	// Headline is the notification's line where Message is longer than a
	// notification shows (JupyterLab cuts a toast's message at 140
	// characters), or says less than a toast out of the notebook needs (a
	// cull warning's names its notebook); "" where Message does.
	Headline string `json:"headline,omitempty"`
}

// InNotebook reports whether a's kind is shown in notebooks, before a
// cell's output: a process left running is the business of the user who
// ends it, from `gpumem ls` or JupyterLab; an out-of-memory error the
// notebook showed itself, with its report.
func (a Alert) InNotebook() bool { return a.Kind == AlertThreshold || a.Kind == AlertCull }

// AlertConfig is how threshold alerts are raised.
type AlertConfig struct {
	// Threshold is the alert level as a fraction of a GPU's memory (0.8 =
	// 80%); 0 or less disables threshold alerts.
	Threshold float64
	// Episodes counts each GPU's crossings of the threshold (by index): an
	// alert's id is new for each. A GPU without an entry is at its first.
	Episodes map[int]int
	// NameUsers: the alerts name users, never notebooks or commands (every
	// user's kernels read them: a shared daemon).
	NameUsers bool
}

// alertHolders is how many holders a threshold alert names.
const alertHolders = 3

// CullWarning is a cull warning that stands for a kernel.
type CullWarning struct {
	KernelID       string
	ConnectionFile string
	User           string
	// Warning counts the kernel's warnings so far: each alert id is new.
	Warning  int
	Deadline time.Time
	Action   string // CullReport, CullFree or CullShutdown
	Bytes    uint64
	Idle     time.Duration
	// GPUIdle: the warning stands under the GPU-idle rule (--cull-gpu-idle):
	// Idle is how long the kernel's processes did no GPU work, and only
	// GPU work (or a keep) cancels it, not a cell.
	GPUIdle bool
}

// OverThreshold reports whether g's used memory is at or above threshold
// (a fraction of its total): the one predicate of the daemon's log, its
// alerts and its metrics.
func OverThreshold(g GPU, threshold float64) bool {
	if threshold <= 0 || g.MemoryTotalBytes == 0 {
		return false
	}
	return float64(g.MemoryUsedBytes) >= threshold*float64(g.MemoryTotalBytes)
}

// CullMessage is a cull warning's sentence, in the notebook and JupyterLab.
// Like every alert's message it carries no "gpumem: " of its own: a face
// that needs to say whose line it is (the notebook's) adds that.
func CullMessage(c CullWarning) string {
	if c.GPUIdle {
		return fmt.Sprintf("this kernel holds %s and has done no GPU work for %s; it will %s at %s unless it computes on a GPU "+
			"(running cells alone does not count).", units.Bytes(c.Bytes), units.Duration(c.Idle), cullVerb(c.Action), c.Deadline.Format("15:04:05"))
	}
	return fmt.Sprintf("this kernel holds %s and has been idle %s; it will %s at %s unless used.",
		units.Bytes(c.Bytes), units.Duration(c.Idle), cullVerb(c.Action), c.Deadline.Format("15:04:05"))
}

// cullHeadline is a cull warning's line in JupyterLab, where the toast is
// not in its notebook: it names the notebook (its display name), and says
// that "Keep it" (the toast's button) counts as use.
func cullHeadline(name string, c CullWarning) string {
	if c.GPUIdle {
		return fmt.Sprintf("%s holds %s, no GPU work for %s: it will %s at %s unless it computes on a GPU or is kept.",
			name, units.Bytes(c.Bytes), units.Duration(c.Idle), cullVerb(c.Action), c.Deadline.Format("15:04:05"))
	}
	return fmt.Sprintf("%s holds %s, idle %s: it will %s at %s unless used or kept.",
		name, units.Bytes(c.Bytes), units.Duration(c.Idle), cullVerb(c.Action), c.Deadline.Format("15:04:05"))
}

// cullVerb is what culling will do to a kernel under action.
func cullVerb(action string) string {
	verb, ok := map[string]string{CullReport: "be reported as an idle GPU holder", CullFree: "have its GPU caches freed",
		CullShutdown: "be shut down"}[action]
	if !ok {
		verb = "be culled"
	}
	return verb
}

// usedPercent is how full g is, in percent (0 where its total is unknown).
func usedPercent(g GPU) float64 {
	return 100 * float64(g.MemoryUsedBytes) / float64(max(g.MemoryTotalBytes, 1))
}

// thresholdMessage is a threshold alert's sentence (the GPU, how full,
// its biggest holders and what to do), and its headline for a
// notification (how full and the two biggest), each holder by its Name (a
// notebook's display name).
func thresholdMessage(g GPU, biggest []Holder) (message, headline string) {
	parts := make([]string, 0, len(biggest))
	for _, h := range biggest {
		parts = append(parts, h.Name+" "+units.Bytes(h.Bytes))
	}
	fill := fmt.Sprintf("%.0f%% full: %s of %s used", usedPercent(g),
		units.Bytes(g.MemoryUsedBytes), units.Bytes(g.MemoryTotalBytes))
	message = fmt.Sprintf("GPU %d (%s) is %s; biggest: %s. "+
		"`%%gpumem free` returns this notebook's cached memory; `%%gpumem top` shows who holds the rest.",
		g.Index, g.Name, fill, strings.Join(parts, ", "))
	headline = fmt.Sprintf("GPU %d is %s; biggest: %s", g.Index, fill, strings.Join(parts[:min(len(parts), 2)], ", "))
	return message, headline
}

// addAlerts sets the alerts that stand: the cull warnings, each GPU at or
// over the threshold, each process reclaim left running, and each
// kernel's last out-of-memory error.
func addAlerts(r *Report, in FinishInput) {
	r.Alerts = nil
	var names map[string]string // display names, by connection file: only where a cull warning needs them
	if len(in.Culls) > 0 {
		names = make(map[string]string, len(r.Notebooks))
		for _, nb := range r.Notebooks {
			names[nb.ConnectionFile] = nb.DisplayName
		}
	}
	for _, c := range in.Culls {
		r.Alerts = append(r.Alerts, Alert{ID: fmt.Sprintf("cull-%s-%d", c.KernelID, c.Warning), Kind: AlertCull, GPU: -1,
			Kernels: []string{c.KernelID}, User: c.User, Bytes: c.Bytes, Deadline: c.Deadline, Action: c.Action,
			Message:  CullMessage(c),
			Headline: cullHeadline(cmp.Or(names[c.ConnectionFile], KernelName("", c.KernelID)), c)})
	}
	for _, g := range r.GPUs {
		if !OverThreshold(g, in.Alerts.Threshold) {
			continue
		}
		biggest := g.Holders
		if in.Alerts.NameUsers {
			biggest = g.HoldersByUser
		}
		biggest = biggest[:min(len(biggest), alertHolders)]
		msg, head := thresholdMessage(g, biggest)
		r.Alerts = append(r.Alerts, Alert{ID: fmt.Sprintf("gpu%d-%d", g.Index, max(in.Alerts.Episodes[g.Index], 1)),
			Kind: AlertThreshold, GPU: g.Index, Kernels: kernelsOnGPU(*r, g.Index), Bytes: g.MemoryUsedBytes,
			Message: msg, Headline: head})
	}
	for _, lr := range r.LeftRunning {
		gpu := -1
		if len(lr.GPUs) > 0 {
			gpu = lr.GPUs[0]
		}
		r.Alerts = append(r.Alerts, Alert{ID: fmt.Sprintf("left-%d-%d", lr.PID, lr.StartTime), Kind: AlertLeftRunning,
			GPU: gpu, Kernels: []string{lr.KernelID}, User: lr.User, Bytes: lr.Bytes, Message: lr.Message})
	}
	for _, nb := range r.Notebooks {
		s := nb.OOM
		if s == nil || s.LastHeadline == "" {
			continue
		}
		gpu := -1
		if s.LastGPU != nil {
			gpu = *s.LastGPU
		}
		r.Alerts = append(r.Alerts, Alert{ID: fmt.Sprintf("oom-%s-%d", nb.KernelID, s.LastEvent), Kind: AlertOOM, GPU: gpu,
			Kernels: []string{nb.KernelID}, User: nb.User, Bytes: s.LastRequestedBytes, Message: s.LastHeadline})
	}
}

// AlertsFor is what user may see of r's alerts, in their view of the
// report and in their notebook alert file: their own kernels' alerts, and
// each GPU's (which names users only, never notebooks, where the report was
// made for a shared daemon) listing only their own kernels.
func AlertsFor(r Report, user string) []Alert {
	own := map[string]bool{} // kernel ids
	for _, nb := range r.Notebooks {
		if nb.User == user {
			own[nb.KernelID] = true
		}
	}
	var out []Alert
	for _, a := range r.Alerts {
		if a.User != "" && a.User != user {
			continue
		}
		kernels := []string{}
		for _, k := range a.Kernels {
			if own[k] {
				kernels = append(kernels, k)
			}
		}
		a.Kernels = kernels
		out = append(out, a)
	}
	return out
}

// kernelsOnGPU lists the kernels holding memory (or an unknown amount) on
// gpu.
func kernelsOnGPU(r Report, gpu int) []string {
	ids := []string{}
	for _, nb := range r.Notebooks {
		for _, pg := range nb.PerGPU {
			if pg.Index == gpu && (pg.Bytes > 0 || pg.BytesUnknown) {
				ids = append(ids, nb.KernelID)
				break
			}
		}
	}
	return ids
}
