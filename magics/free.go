package magics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/internal/units"
)

// FreeOptions selects what FreeCache frees. The zero value is cache-only:
// gc.collect() and emptying the frameworks' caches, no variable touched (safe
// on anyone's idle notebook).
type FreeOptions struct {
	Vars   []string // variables to delete, with IPython's hidden references to them
	All    bool     // every variable holding GPU memory, and hidden references holding GPU memory
	Keep   []string // with All: variables to keep
	DryRun bool     // report what would be freed; change nothing
	// DriverBytes, when set, gives the driver's (NVML) figure for the
	// kernel's processes now, or nil when it has none. FreeCache calls it
	// before and after the free and reports both (FreeReport.Driver).
	DriverBytes func(ctx context.Context) *uint64
}

// ErrFreeRefused is wrapped by FreeCache's error when the kernel refused the
// request (an unknown or protected name, --keep without --all): nothing was
// deleted.
var ErrFreeRefused = errors.New("free refused")

// FreeReport is the kernel's account of a free: the "free" data dict of
// the injected package (schema 1), with its renderings as %gpumem free
// shows them, and the driver's figures, which are never the kernel's
// word. A kernel runs its user's code, and its user may replace the
// injected package: everything but Driver is what the kernel says, and
// Text, Error and Notes come made safe to show (textsafe).
type FreeReport struct {
	DryRun     bool            `json:"dry_run"`
	All        bool            `json:"all"`
	CacheOnly  bool            `json:"cache_only"`
	Error      string          `json:"error,omitempty"`
	Deleted    []FreedVar      `json:"deleted"`
	Hidden     []HiddenRef     `json:"hidden"`
	Frameworks []FrameworkFree `json:"frameworks"`
	// Driver is read by the caller (FreeOptions.DriverBytes) after the
	// kernel answered; nil without a reading. A figure the kernel put
	// there is dropped.
	Driver    *DriverDelta `json:"driver,omitempty"`
	Notes     []string     `json:"notes"`
	ElapsedMS int64        `json:"elapsed_ms"`
	// Returned is true when the free gave memory back to the GPU, and
	// Summary says what it returned in one line (a notification's):
	// computed here once (FreeReport.outcome), so that no face judges it
	// again.
	Returned bool   `json:"returned"`
	Summary  string `json:"summary"`
	// Text and HTML are the kernel's renderings of this report (Text made
	// safe for a terminal, its lines kept; HTML as the kernel wrote it).
	// Neither holds the driver's figures: Render adds them.
	Text string `json:"text"`
	HTML string `json:"html"`
}

// FreedVar is a variable that was (or, dry run, would be) deleted.
type FreedVar struct {
	Name   string   `json:"name"`
	Type   string   `json:"type"`
	Device string   `json:"device"`
	Bytes  uint64   `json:"bytes"`
	Alive  bool     `json:"alive"`   // still referenced after the free
	HeldBy []string `json:"held_by"` // who still holds it, when known
}

// HiddenRef is one of IPython's hidden references (Out[N], _, a saved
// traceback's frame locals...). Action "drop": dropped (or would be);
// "kept": left alone (cache-only free) though it holds GPU memory.
type HiddenRef struct {
	Ref    string `json:"ref"`
	What   string `json:"what"`
	Action string `json:"action"`
	Bytes  uint64 `json:"bytes"`
}

// FrameworkFree is one framework's memory on one device before and after.
type FrameworkFree struct {
	Name   string      `json:"name"`  // torch, cupy, jax, tensorflow
	Label  string      `json:"label"` // PyTorch, CuPy, JAX, TensorFlow
	Device string      `json:"device"`
	Before MemoryUsage `json:"before"`
	After  MemoryUsage `json:"after"`
}

// MemoryUsage is what a framework has in use and holds from the GPU (in
// use plus its cache or pool). Held is nil where the framework cannot tell
// (TensorFlow).
type MemoryUsage struct {
	Used uint64  `json:"used"`
	Held *uint64 `json:"held"`
}

// returned is how much the framework gave back to the GPU (held before minus
// held after), and whether it is known.
func (f FrameworkFree) returned() (int64, bool) {
	if f.Before.Held == nil || f.After.Held == nil {
		return 0, false
	}
	return int64(*f.Before.Held) - int64(*f.After.Held), true
}

// DriverDelta is the driver's (NVML) figure for the kernel's processes
// before and after the free, read by gpumem serve.
type DriverDelta struct {
	Before uint64 `json:"before"`
	After  uint64 `json:"after"`
}

// FreeCache runs a free in the kernel behind ex, after its current cell (the
// request queues on the shell channel; it never interrupts). With the zero
// FreeOptions it only collects garbage and empties the frameworks' caches.
// It uses the injected magics when their version matches, else runs the
// embedded code without registering any magic. With opts.DriverBytes the
// report carries the driver's figure read before the request and after
// the kernel's answer, here in Go: the kernel neither asks for it nor
// renders it, so it cannot change it.
func FreeCache(ctx context.Context, ex Executor, opts FreeOptions) (FreeReport, error) {
	if err := requirePython(ctx, ex); err != nil {
		return FreeReport{}, err
	}
	var before *uint64
	// "driver": false: the kernel asks gpumem serve for nothing.
	req := map[string]any{"vars": nonNil(opts.Vars), "keep": nonNil(opts.Keep), "all": opts.All, "dry_run": opts.DryRun,
		"driver": false}
	if opts.DriverBytes != nil && !opts.DryRun {
		before = opts.DriverBytes(ctx)
	}
	raw, err := runAction(ctx, ex, "free", req)
	if err != nil {
		return FreeReport{}, err
	}
	var fr FreeReport
	if err := json.Unmarshal(raw, &fr); err != nil {
		return FreeReport{}, fmt.Errorf("free: decode the kernel's report: %w", err)
	}
	fr.safe()
	if fr.Error != "" {
		fr.Summary = "refused: " + fr.Error
		return fr, fmt.Errorf("%w: the kernel says: %s", ErrFreeRefused, fr.Error)
	}
	if before == nil || fr.DryRun {
		return fr.withOutcome(), nil
	}
	if after := opts.DriverBytes(ctx); after != nil {
		fr.Driver = &DriverDelta{Before: *before, After: *after}
	}
	return fr.withOutcome(), nil
}

// safe drops what the kernel may not say (the driver's figures) and makes
// what it says safe to show.
func (r *FreeReport) safe() {
	r.Driver = nil
	r.Text = textsafe.Block(r.Text)
	r.Error = textsafe.Line(r.Error)
	for i, n := range r.Notes {
		r.Notes[i] = textsafe.Line(n)
	}
}

// Render is the report as `gpumem free` prints it: the kernel's own text,
// each line marked as the kernel's ("kernel| "), then the driver's
// figures, which gpumem read itself. Only the latter line starts with
// "driver": a kernel that writes one into its text cannot pass it off.
func (r FreeReport) Render() string {
	var b strings.Builder
	writeKernelText(&b, r.Text)
	switch {
	case r.Driver != nil:
		fmt.Fprintf(&b, "driver (NVML, read by gpumem serve): %s -> %s for this kernel (%s)",
			units.Bytes(r.Driver.Before), units.Bytes(r.Driver.After), units.Delta(int64(r.Driver.After)-int64(r.Driver.Before)))
	case r.DryRun:
		b.WriteString("driver (NVML): not read (a dry run frees nothing)")
	default:
		b.WriteString("driver (NVML): not read (no gpumem serve follows this kernel)")
	}
	return b.String()
}

// withOutcome sets Returned and Summary.
func (r FreeReport) withOutcome() FreeReport {
	r.Returned, r.Summary = r.outcome()
	return r
}

// outcome judges what a free gave back to the GPU: by the driver's figure
// for the kernel when gpumem serve read it before and after (what
// nvidia-smi counts), else by what the frameworks' caches held before and
// after. Memory still in use, and the CUDA context, stay: a free that
// moved nothing says so rather than "freed".
func (r FreeReport) outcome() (returned bool, summary string) {
	if r.DryRun {
		return false, "dry run: nothing was freed"
	}
	if d := r.Driver; d != nil {
		if d.After < d.Before {
			return true, fmt.Sprintf("returned %s to the GPU (the driver's figure for the kernel: %s → %s)",
				units.Bytes(d.Before-d.After), units.Bytes(d.Before), units.Bytes(d.After))
		}
		if d.After == 0 {
			return false, "returned nothing: the kernel holds no GPU memory"
		}
		return false, fmt.Sprintf("returned nothing to the GPU: the driver still counts %s for the kernel (in use, or its CUDA context)",
			units.Bytes(d.After))
	}
	var back uint64
	known := false
	for _, f := range r.Frameworks {
		if n, ok := f.returned(); ok {
			known = true
			if n > 0 {
				back += uint64(n)
			}
		}
	}
	switch {
	case back > 0:
		return true, fmt.Sprintf("returned %s of cached memory to the GPU", units.Bytes(back))
	case known:
		return false, "returned nothing to the GPU: no framework held cached memory"
	case len(r.Frameworks) > 0:
		return false, "the frameworks cannot say what they returned (TensorFlow keeps its memory until the kernel exits)"
	}
	return false, "returned nothing: no framework holds GPU memory in this kernel"
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
