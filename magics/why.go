package magics

import (
	"context"
	"encoding/json"
)

// WhyOptions selects what Why accounts for.
type WhyOptions struct {
	Device     *int    // only this CUDA device (the framework's numbering); nil: every GPU
	AllDevices bool    // the CPU's tensors too
	Budget     float64 // seconds the kernel may spend; 0: its default (2 s)
}

// Why returns the data of `%gpumem why` for the kernel behind ex (the
// "why" dict of py/gpumem_magics/why.py: rows of what holds the kernel's
// framework memory, with chains and fixes, and the frameworks' figures per
// device), read by a silent execute after the kernel's current cell. The
// driver's figures are not in it: attribution.JoinWhy adds them.
func Why(ctx context.Context, ex Executor, opts WhyOptions) (json.RawMessage, error) {
	args := map[string]any{"all_devices": opts.AllDevices}
	if opts.Device != nil {
		args["device"] = *opts.Device
	}
	if opts.Budget > 0 {
		args["budget"] = opts.Budget
	}
	return query(ctx, ex, "why", args)
}

// Teardown runs the frameworks' own teardown of the kernel's worker
// processes (DataLoader workers, multiprocessing pools, process pool
// executors, ray, inference engines) and returns the "children" dict of
// what ran. It ends no process by signal: that is the daemon's, under
// reclaim's policy.
func Teardown(ctx context.Context, ex Executor) (json.RawMessage, error) {
	return query(ctx, ex, "teardown", nil)
}

// Render has the kernel render a data dict (any kind the injected package
// renders) and returns it with its "text" and "html".
func Render(ctx context.Context, ex Executor, data any) (json.RawMessage, error) {
	return runJSON(ctx, ex, "render", data)
}
