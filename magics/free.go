package magics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// FreeOptions selects what FreeCache frees. The zero value is cache-only:
// gc.collect() and emptying the frameworks' caches, no variable touched (safe
// on anyone's idle notebook).
type FreeOptions struct {
	Vars   []string // variables to delete, with IPython's hidden references to them
	All    bool     // every variable holding GPU memory, and hidden references holding GPU memory
	Keep   []string // with All: variables to keep
	DryRun bool     // report what would be freed; change nothing
}

// ErrFreeRefused is wrapped by FreeCache's error when the kernel refused the
// request (an unknown or protected name, --keep without --all): nothing was
// deleted.
var ErrFreeRefused = errors.New("free refused")

// FreeReport is the kernel's account of a free: the "free" data dict of
// gpumem_magics.py (schema 1), as %gpumem free shows it.
type FreeReport struct {
	DryRun     bool            `json:"dry_run"`
	All        bool            `json:"all"`
	CacheOnly  bool            `json:"cache_only"`
	Error      string          `json:"error,omitempty"`
	Deleted    []FreedVar      `json:"deleted"`
	Hidden     []HiddenRef     `json:"hidden"`
	Frameworks []FrameworkFree `json:"frameworks"`
	Driver     *DriverDelta    `json:"driver,omitempty"`
	Notes      []string        `json:"notes"`
	ElapsedMS  int64           `json:"elapsed_ms"`
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

// Returned is how much the framework gave back to the GPU (held before minus
// held after), and whether it is known.
func (f FrameworkFree) Returned() (int64, bool) {
	if f.Before.Held == nil || f.After.Held == nil {
		return 0, false
	}
	return int64(*f.Before.Held) - int64(*f.After.Held), true
}

// DriverDelta is the driver's (NVML) figure for the kernel before and after,
// from gpumem serve, when the kernel was injected with its socket.
type DriverDelta struct {
	Before uint64 `json:"before"`
	After  uint64 `json:"after"`
}

// FreeCache runs a free in the kernel behind ex, after its current cell (the
// request queues on the shell channel; it never interrupts). With the zero
// FreeOptions it only collects garbage and empties the frameworks' caches.
// It uses the injected magics when their version matches, else runs the
// embedded code without registering any magic.
func FreeCache(ctx context.Context, ex Executor, opts FreeOptions) (FreeReport, error) {
	var ir InjectResult
	if err := checkKernel(ctx, ex, &ir); err != nil {
		return FreeReport{}, err
	}
	req := map[string]any{"vars": nonNil(opts.Vars), "keep": nonNil(opts.Keep), "all": opts.All, "dry_run": opts.DryRun}
	rep, err := runBoot(ctx, ex, "free", map[string]any{"version": Version()}, req)
	if err != nil {
		return FreeReport{}, err
	}
	if !rep.OK {
		if strings.Contains(rep.Error, "no IPython shell") {
			return FreeReport{}, fmt.Errorf("free: %s: %w", rep.Error, ErrUnsupportedKernel)
		}
		return FreeReport{}, fmt.Errorf("free: failed in the kernel: %s", rep.Error)
	}
	var fr FreeReport
	if err := json.Unmarshal(rep.Result, &fr); err != nil {
		return FreeReport{}, fmt.Errorf("free: decode the kernel's report: %w", err)
	}
	if fr.Error != "" {
		return fr, fmt.Errorf("%w: %s", ErrFreeRefused, fr.Error)
	}
	return fr, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// WriteText writes the report as the CLI prints it.
func (r FreeReport) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	switch {
	case r.DryRun:
		ew.printf("dry run: nothing was freed\n")
	case r.CacheOnly:
		ew.printf("emptied the caches; no variable was touched\n")
	case r.Error == "":
		n := 0
		for _, d := range r.Deleted {
			if !d.Alive {
				n++
			}
		}
		ew.printf("deleted %d variable(s), %d of them freed\n", len(r.Deleted), n)
	}
	if r.Error != "" {
		ew.printf("error: %s\n", r.Error)
		return ew.err
	}
	if len(r.Deleted) > 0 {
		if r.DryRun {
			ew.printf("\nwould delete:\n")
		} else {
			ew.printf("\ndeleted:\n")
		}
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		for _, d := range r.Deleted {
			status := "freed"
			switch {
			case r.DryRun:
				status = ""
			case d.Alive && len(d.HeldBy) > 0:
				status = "still referenced by " + strings.Join(d.HeldBy, ", ")
			case d.Alive:
				status = "still referenced elsewhere"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", d.Name, d.Type, d.Device, FormatBytes(d.Bytes), status)
		}
		ew.flush(tw)
	}
	if len(r.Hidden) > 0 {
		ew.printf("\nIPython's hidden references:\n")
		for _, h := range r.Hidden {
			switch {
			case h.Action == "kept":
				ew.printf("  kept %s (%s): %s; `%%gpumem free --all` in the notebook drops it\n", h.Ref, h.What, FormatBytes(h.Bytes))
			case r.DryRun:
				ew.printf("  would drop %s (%s)\n", h.Ref, h.What)
			default:
				ew.printf("  dropped %s (%s)\n", h.Ref, h.What)
			}
		}
	}
	ew.printf("\n")
	if len(r.Frameworks) == 0 {
		ew.printf("No framework held GPU memory before or after.\n")
	} else {
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "framework\tdevice\tbefore (in use / held)\tafter (in use / held)\treturned to GPU\n")
		for _, f := range r.Frameworks {
			ret := "-"
			if n, ok := f.Returned(); ok {
				ret = formatSigned(n)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.Label, f.Device, f.Before.text(), f.After.text(), ret)
		}
		ew.flush(tw)
	}
	if r.Driver != nil {
		ew.printf("driver (NVML): %s -> %s for this kernel (%s)\n", FormatBytes(r.Driver.Before), FormatBytes(r.Driver.After),
			formatDelta(int64(r.Driver.After)-int64(r.Driver.Before)))
	}
	if len(r.Notes) > 0 {
		ew.printf("\n")
		for _, n := range r.Notes {
			ew.printf("%s\n", n)
		}
	}
	ew.printf("took %d ms in the kernel\n", r.ElapsedMS)
	return ew.err
}

// Text returns WriteText's output.
func (r FreeReport) Text() string {
	var b strings.Builder
	_ = r.WriteText(&b) // a strings.Builder does not fail
	return b.String()
}

func (u MemoryUsage) text() string {
	held := "?"
	if u.Held != nil {
		held = FormatBytes(*u.Held)
	}
	return FormatBytes(u.Used) + " / " + held
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	fmt.Fprintf(e, format, args...)
}

func (e *errWriter) flush(tw *tabwriter.Writer) {
	if err := tw.Flush(); err != nil && e.err == nil {
		e.err = err
	}
}

// FormatBytes formats a byte count in binary units as the magics do:
// "512 B", "1.50 KiB", "2.00 GiB".
func FormatBytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, unit := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		f /= 1024
		if f < 1024 || unit == "PiB" {
			return fmt.Sprintf("%.2f %s", f, unit)
		}
	}
	return fmt.Sprintf("%d B", n)
}

func formatSigned(n int64) string {
	if n < 0 {
		return "-" + FormatBytes(uint64(-n))
	}
	return FormatBytes(uint64(n))
}

func formatDelta(n int64) string {
	if n > 0 {
		return "+" + FormatBytes(uint64(n))
	}
	return formatSigned(n)
}
