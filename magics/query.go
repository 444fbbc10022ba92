package magics

import (
	"context"
	"encoding/json"
	"fmt"
)

// Vars returns the data of `%gpumem vars` for the kernel behind ex (the
// "vars" dict of gpumem_magics.py: rows largest first, total, notes), read
// by a silent execute: nothing is shown in the notebook and no variable is
// touched. It queues behind the kernel's current cell. allDevices lists
// tensors on every device, the CPU included (`%gpumem vars --all-devices`).
func Vars(ctx context.Context, ex Executor, allDevices bool) (json.RawMessage, error) {
	return query(ctx, ex, "vars", map[string]any{"all_devices": allDevices})
}

// Summary returns the data of `%gpumem` for the kernel behind ex (the
// "summary" dict: per-framework figures per device, the driver's figure
// when the kernel knows gpumem serve's socket, advice), read silently.
func Summary(ctx context.Context, ex Executor) (json.RawMessage, error) {
	return query(ctx, ex, "summary", nil)
}

// query runs a read-only action in a Python kernel and returns its data.
func query(ctx context.Context, ex Executor, action string, args map[string]any) (json.RawMessage, error) {
	if err := requirePython(ctx, ex); err != nil {
		return nil, err
	}
	return runJSON(ctx, ex, action, args)
}

// runJSON runs an action and returns its result, which must be JSON.
func runJSON(ctx context.Context, ex Executor, action string, request any) (json.RawMessage, error) {
	result, err := runAction(ctx, ex, action, request)
	if err != nil {
		return nil, err
	}
	if !json.Valid(result) || len(result) == 0 {
		return nil, fmt.Errorf("%s: the kernel's result is not JSON", action)
	}
	return result, nil
}
