package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// kubeflowActivityProbe is the JSON Kubeflow Notebooks' culling controller
// parses from an exec activity probe's output (its ActivityProbe type):
// has_activity, or last_activity in RFC 3339. The probe's answer must
// decode into it with no other field.
type kubeflowActivityProbe struct {
	HasActivity  *bool   `json:"has_activity,omitempty"`
	LastActivity *string `json:"last_activity,omitempty"`
}

func TestWorkspaceActivity(t *testing.T) {
	now := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)
	gib := uint64(1 << 30)
	nb := func(f func(*attribution.Notebook)) attribution.Notebook {
		n := attribution.Notebook{KernelID: "k1", Notebook: "/home/jovyan/train.ipynb", ConnectionFile: "/run/k1.json",
			GPUMemoryBytes: 40 * gib, Utilization: &attribution.Utilization{},
			Activity: &attribution.Activity{ExecutionState: "idle", LastActivity: now.Add(-2 * time.Hour)}}
		f(&n)
		return n
	}
	finish := func(nbs ...attribution.Notebook) attribution.Report {
		r := attribution.Report{Notebooks: slices.Clone(nbs)}
		attribution.Finish(&r, attribution.FinishInput{Now: now})
		// Finish writes activity from its input; these rows bring their own.
		for i := range r.Notebooks {
			r.Notebooks[i].Activity = nbs[i].Activity
			r.Notebooks[i].Compute = nbs[i].Compute
		}
		return r
	}
	idle := func(n *attribution.Notebook) {}
	tests := []struct {
		name    string
		rep     attribution.Report
		servers time.Time
		active  bool
		last    time.Time
		why     string
	}{
		{"a cell runs", finish(nb(func(n *attribution.Notebook) { n.Activity.ExecutionState = "busy" })), time.Time{}, true, time.Time{}, "train.ipynb runs a cell"},
		{"the daemon's verdict: computing (a training job in a closed tab)", finish(nb(func(n *attribution.Notebook) {
			n.Compute = &attribution.Compute{State: attribution.ComputeComputing, Reason: "118 readings"}
		})), time.Time{}, true, time.Time{}, "computes on a GPU"},
		{"standalone: a reading now", finish(nb(func(n *attribution.Notebook) { n.Utilization.SMPercent = 90 })), time.Time{}, true, time.Time{}, "90% SM"},
		{"holds memory, GPU work unknown: in use", finish(nb(func(n *attribution.Notebook) {
			n.Compute = &attribution.Compute{State: attribution.ComputeUnknown}
		})), time.Time{}, true, time.Time{}, "unknown"},
		{"holds memory, no utilization at all: in use", finish(nb(func(n *attribution.Notebook) { n.Utilization = nil })), time.Time{}, true, time.Time{}, "unknown"},
		{"idle, holding memory: its last use", finish(nb(idle)), time.Time{}, false, now.Add(-2 * time.Hour), "last used"},
		{"idle, last GPU work after its last cell", finish(nb(func(n *attribution.Notebook) {
			n.Compute = &attribution.Compute{State: attribution.ComputeIdle, LastComputedAt: now.Add(-time.Hour)}
		})), time.Time{}, false, now.Add(-time.Hour), "last used"},
		{"the server's own activity is later", finish(nb(idle)), now.Add(-10 * time.Minute), false, now.Add(-10 * time.Minute), "last used"},
		{"no kernel: the server's own activity", finish(), now.Add(-3 * time.Hour), false, now.Add(-3 * time.Hour), "last used"},
	}
	for _, tc := range tests {
		probe, why, err := workspaceActivity(tc.rep, tc.servers)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !strings.Contains(why, tc.why) {
			t.Errorf("%s: reason %q lacks %q", tc.name, why, tc.why)
		}
		b, _ := json.Marshal(probe)
		var got kubeflowActivityProbe
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("%s: %s is not Kubeflow's activity probe JSON: %v", tc.name, b, err)
		}
		if (got.HasActivity != nil) == (got.LastActivity != nil) {
			t.Errorf("%s: %s: want exactly one of has_activity and last_activity", tc.name, b)
		}
		if got.HasActivity != nil && !*got.HasActivity {
			t.Errorf("%s: %s: has_activity false pauses a workspace at once; gpumem never says it", tc.name, b)
		}
		if tc.active != (got.HasActivity != nil) {
			t.Errorf("%s: %s, want in use %v", tc.name, b, tc.active)
		}
		if !tc.active {
			at, err := time.Parse(time.RFC3339, *got.LastActivity)
			if err != nil || !at.Equal(tc.last) {
				t.Errorf("%s: last_activity %q (%v), want %v", tc.name, *got.LastActivity, err, tc.last)
			}
		}
	}
	if _, _, err := workspaceActivity(finish(), time.Time{}); !errors.Is(err, errNoActivityFacts) {
		t.Errorf("no kernel, no server: %v, want a failed probe (Kubeflow culls nothing on it)", err)
	}
}

// The answer goes to the probe's output path whole, replacing what was
// there.
func TestWriteFileAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "activity.json")
	for _, body := range []string{`{"has_activity":true}` + "\n", `{"last_activity":"2026-12-03T12:00:00Z"}` + "\n"} {
		if err := writeFileAtomic(path, []byte(body)); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(path); string(got) != body {
			t.Errorf("file %q, want %q", got, body)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".gpumem-activity-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
