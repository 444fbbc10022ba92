package prometheus

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The shipped configuration and rules pass promtool's checks, and the rules
// their unit tests.
func TestPromtoolRules(t *testing.T) {
	promtool := requireTool(t, "promtool")
	rules := repoPath(t, "deploy/prometheus/gpumem-rules.yml")
	tests, err := filepath.Glob(repoPath(t, "deploy/prometheus/tests/*.yml"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no rule unit tests under deploy/prometheus/tests (%v)", err)
	}
	for _, args := range [][]string{
		{"check", "config", repoPath(t, "deploy/prometheus/prometheus.yml")},
		{"check", "rules", rules},
		append([]string{"test", "rules"}, tests...),
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}
