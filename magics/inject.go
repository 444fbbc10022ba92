package magics

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// InjectOptions configures the injected magics.
type InjectOptions struct {
	// SidecarSocket is the unix socket of `gpumem serve`'s API; with it
	// %gpumem shows the driver's (NVML) figure for the kernel. "" = none
	// (the magic then also honours $GPUMEM_SOCKET in the kernel).
	SidecarSocket string
	// KernelID is the kernel's id as gpumem serve knows it; the magic asks
	// the API for that kernel only (all that shared mode allows a kernel).
	KernelID string
	// AlertFile, when set, is the file gpumem serve writes its GPU memory
	// alerts to; a pre_run_cell hook then prints, at the next cell run, the
	// alerts that name this kernel (one stat() per cell).
	AlertFile string
}

// InjectResult says what Inject did.
type InjectResult struct {
	Injected bool   // the magics are registered in the kernel now
	Replaced bool   // an earlier injection was there and was replaced
	Version  string // the injected source's Version()
	// From kernel_info.
	Implementation  string // e.g. "ipython"
	Language        string // e.g. "python"
	LanguageVersion string // e.g. "3.11.2"
	IPythonVersion  string // reported by the bootstrap
	// FrameworksLoaded lists the GPU frameworks already imported in the
	// kernel (torch, cupy, jax, tensorflow): what %gpumem can report on.
	FrameworksLoaded []string
	// Reason says why nothing was injected (Injected false).
	Reason string
}

// String is one line for `gpumem attach`.
func (r InjectResult) String() string {
	if !r.Injected {
		return "nothing was injected: " + r.Reason
	}
	verb := "injected"
	if r.Replaced {
		verb = "replaced the earlier"
	}
	fw := "no GPU framework loaded yet"
	if len(r.FrameworksLoaded) > 0 {
		fw = "frameworks loaded: " + strings.Join(r.FrameworksLoaded, ", ")
	}
	return fmt.Sprintf("%s %%gpumem magics (version %s) into %s %s, IPython %s; %s. Type %%gpumem help in the notebook.",
		verb, r.Version, r.Language, r.LanguageVersion, r.IPythonVersion, fw)
}

// Inject registers the %gpumem magics in the kernel behind ex, replacing an
// earlier injection. It checks kernel_info first: a kernel that is not
// Python 3 gets nothing and the error wraps ErrUnsupportedKernel (the result
// then says why). The execute is silent and stores no history; it queues
// behind the kernel's current cell.
func Inject(ctx context.Context, ex Executor, opts InjectOptions) (InjectResult, error) {
	res := InjectResult{Version: Version()}
	if err := checkKernel(ctx, ex, &res); err != nil {
		return res, err
	}
	rep, err := runBoot(ctx, ex, "inject", opts.config(), nil)
	if err != nil {
		return res, err
	}
	res.IPythonVersion = rep.IPython
	res.FrameworksLoaded = rep.FrameworksLoaded
	if !rep.OK {
		res.Reason = rep.Error
		if rep.unsupportedKernel() {
			return res, fmt.Errorf("inject: %s: %w", rep.Error, ErrUnsupportedKernel)
		}
		return res, fmt.Errorf("inject: the kernel's bootstrap failed: %s", rep.Error)
	}
	res.Injected = true
	res.Replaced = rep.Replaced
	return res, nil
}

// config is the injected package's configuration for opts.
func (opts InjectOptions) config() map[string]any {
	cfg := map[string]any{"version": Version()}
	if opts.SidecarSocket != "" {
		cfg["sidecar_socket"] = opts.SidecarSocket
	}
	if opts.KernelID != "" {
		cfg["kernel_id"] = opts.KernelID
	}
	if opts.AlertFile != "" {
		cfg["alert_file"] = opts.AlertFile
		cfg["notebook_alerts"] = true
	}
	return cfg
}

// Cell is the silent cell that Inject sends, for a program that drives a
// kernel its own way (the GPU host's check of the magics runs it through
// jupyter_client and through an in-process IPython shell): it executes
// Code silently, with Expr as the user expression "gpumem", whose
// application/json result is the bootstrap's report carrying Nonce.
type Cell struct {
	Code    string `json:"code"`
	Expr    string `json:"expr"`
	Nonce   string `json:"nonce"`
	Version string `json:"version"` // the injected package's Version()
}

// InjectCell is the cell Inject would send with opts, without a kernel:
// the wire format is written here only, never again by its users.
func InjectCell(opts InjectOptions) (Cell, error) {
	code, expr, nonce, err := bootCode("inject", opts.config(), nil)
	if err != nil {
		return Cell{}, err
	}
	return Cell{Code: code, Expr: expr, Nonce: nonce, Version: Version()}, nil
}

// Status says whether the magics are injected in the kernel, and which
// version, without changing anything.
type Status struct {
	Injected         bool
	Version          string // "" when not injected
	PID              int
	Python           string
	IPythonVersion   string
	FrameworksLoaded []string
}

// GetStatus asks the kernel whether the magics are injected.
func GetStatus(ctx context.Context, ex Executor) (Status, error) {
	if err := requirePython(ctx, ex); err != nil {
		return Status{}, err
	}
	rep, err := runBoot(ctx, ex, "status", map[string]any{"version": Version()}, nil)
	if err != nil {
		return Status{}, err
	}
	st := Status{Python: rep.Python, IPythonVersion: rep.IPython, FrameworksLoaded: rep.FrameworksLoaded}
	if !rep.OK {
		return st, fmt.Errorf("status: %s", rep.Error)
	}
	if len(rep.Result) > 0 && string(rep.Result) != "null" {
		var r struct {
			Version string `json:"version"`
			PID     int    `json:"pid"`
		}
		if err := json.Unmarshal(rep.Result, &r); err != nil {
			return st, fmt.Errorf("status: decode the kernel's answer: %w", err)
		}
		st.Injected, st.Version, st.PID = true, r.Version, r.PID
	}
	return st, nil
}
