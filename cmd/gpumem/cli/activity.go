package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
)

// kubeflowProbe is what Kubeflow Notebooks' culling controller reads from
// a WorkspaceKind's exec activity probe (the JSON its script leaves at the
// probe's output path): has_activity true for a workspace in use now; else
// last_activity (RFC 3339), from which it counts maxInactiveSeconds. The
// controller pauses a workspace at once on has_activity false, so gpumem
// never says false: an idle workspace gets its last use instead.
type kubeflowProbe struct {
	HasActivity  *bool   `json:"has_activity,omitempty"`
	LastActivity *string `json:"last_activity,omitempty"`
}

// errNoActivityFacts: nothing says when the workspace was last used. The
// command then fails, and Kubeflow records a failed probe: it culls
// nothing on missing facts.
var errNoActivityFacts = errors.New("no kernel and no Jupyter server answered: nothing says when this workspace was last used")

// workspaceActivity is the probe's answer from the finished report and the
// Jupyter servers' own last activity (zero: none answered), with the reason
// in words. In use now: a cell runs, or a kernel's tree computes on a GPU
// (the daemon's verdict, or standalone a reading now), or a kernel holds
// GPU memory whose work the GPU cannot report (never idle on missing
// facts). Otherwise the newest of the kernels' last use (cells, GPU work)
// and the servers' own activity.
func workspaceActivity(rep attribution.Report, serversLast time.Time) (kubeflowProbe, string, error) {
	yes := true
	var last time.Time
	later := func(t time.Time) {
		if t.After(last) {
			last = t
		}
	}
	for _, nb := range rep.Notebooks {
		name := nb.DisplayName
		switch {
		case nb.Activity != nil && nb.Activity.ExecutionState == "busy":
			return kubeflowProbe{HasActivity: &yes}, name + " runs a cell", nil
		case nb.Compute != nil && nb.Compute.State == attribution.ComputeComputing:
			return kubeflowProbe{HasActivity: &yes}, name + " computes on a GPU (" + nb.Compute.Reason + ")", nil
		case nb.Compute == nil && nb.Utilization != nil && nb.Utilization.SMPercent > 0:
			return kubeflowProbe{HasActivity: &yes}, fmt.Sprintf("%s computes on a GPU now (%d%% SM)", name, nb.Utilization.SMPercent), nil
		case nb.GPUMemoryBytes > 0 && (nb.Compute != nil && nb.Compute.State == attribution.ComputeUnknown || nb.Compute == nil && nb.Utilization == nil):
			return kubeflowProbe{HasActivity: &yes}, fmt.Sprintf("%s holds %s and its GPU work is unknown: taken as in use", name, units.Bytes(nb.GPUMemoryBytes)), nil
		}
		if nb.Activity != nil {
			later(nb.Activity.LastActivity)
		}
		if nb.Compute != nil {
			later(nb.Compute.LastComputedAt)
		}
	}
	later(serversLast)
	if last.IsZero() {
		return kubeflowProbe{}, "", errNoActivityFacts
	}
	at := last.UTC().Format(time.RFC3339)
	return kubeflowProbe{LastActivity: &at}, fmt.Sprintf("no kernel runs a cell or computes on a GPU; last used %s", at), nil
}

func runActivity(ctx context.Context, env Env, args []string) error {
	fs := newFlagSet(env, "activity", "[--output FILE] [--runtime-dir DIR ...]")
	output := fs.String("output", "", "also write the answer to `FILE` (a Kubeflow activity probe's output path), atomically")
	var dirs dirList
	fs.Var(&dirs, "runtime-dir", "also scan this Jupyter runtime `dir` (repeatable; it must exist)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	sampler, err := newReporter(ctx, env, dirs, newLsTiming(env))
	if err != nil {
		return err
	}
	defer sampler.Close()
	rep, err := sampler.Report(ctx)
	if err != nil {
		return err
	}
	// Standalone, the report's discovery found the servers already; the
	// daemon's report names none.
	var servers []discovery.Server
	if standalone, ok := sampler.(*lsSampler); ok {
		servers = standalone.servers
	} else {
		servers = discoverKernels(ctx, env, discovery.NewProcFinder(env.procFS()), dirs).Servers
	}
	probe, why, err := workspaceActivity(rep, serversLastActivity(ctx, env, servers))
	if err != nil {
		return err
	}
	b, err := json.Marshal(probe)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if *output != "" {
		if err := writeFileAtomic(*output, b); err != nil {
			return fmt.Errorf("--output %s: %w", *output, err)
		}
	}
	fmt.Fprintf(env.Stderr, "gpumem: %s\n", why)
	_, err = env.Stdout.Write(b)
	return err
}

// serversLastActivity is the newest last activity the Jupyter servers
// report of themselves (zero: none answered).
func serversLastActivity(ctx context.Context, env Env, servers []discovery.Server) time.Time {
	hc := &http.Client{Timeout: 10 * time.Second}
	var last time.Time
	for _, s := range servers {
		if at, err := s.LastActivity(ctx, hc); err == nil && at.After(last) {
			last = at
		} else if err != nil {
			fmt.Fprintf(env.Stderr, "gpumem: %s\n", errorText(err))
		}
	}
	return last
}

// writeFileAtomic writes b to path through a temporary file in its dir:
// a reader never sees half an answer.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".gpumem-activity-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
