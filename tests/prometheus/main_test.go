// Package prometheus holds end-to-end scenarios of gpumem with a real
// Prometheus: Debian's prometheus binary scraping the real `gpumem serve`
// binary (the test stack's Notebook server, real kernels, a simulated-GPU
// file listing their pids), loading deploy/prometheus's rules, and answering
// every query of deploy/grafana's dashboard. It also runs promtool over the
// rules and their unit tests and over a live /metrics, and a fleet of
// simulated nodes' daemons behind one Prometheus scraping them as the Helm
// chart's ServiceMonitor does (fleet_test.go).
//
// Under CI=true a missing prometheus or promtool fails; elsewhere it skips.
package prometheus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/gpumem/gpumem/internal/testenv"
)

var gpumemBin string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithGpumem(m, "gpumem-prometheus-test", &gpumemBin))
}

// requireTool returns the path of a Prometheus binary, failing under CI=true
// and skipping elsewhere when it is not installed.
func requireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("%s not found: apt-get install prometheus (bash scripts/test.sh does)", name)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// repoPath is a path in the repository, absolute (Prometheus resolves rule
// files against its config file's directory).
func repoPath(t testing.TB, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// server is a running Prometheus.
type server struct {
	proc    *testenv.Proc
	url     string
	api     promv1.API
	started time.Time
}

// startPrometheus runs Debian's prometheus on 127.0.0.1 with a temporary
// config and data dir, scraping targets every second under job "gpumem" and
// evaluating deploy/prometheus/gpumem-rules.yml every second. It returns
// once /-/ready answers (deadline 60 s).
func startPrometheus(t *testing.T, targets ...string) *server {
	t.Helper()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = fmt.Sprintf("%q", tg)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: gpumem
    static_configs:
      - targets: [%s]
`, repoPath(t, "deploy/prometheus/gpumem-rules.yml"), strings.Join(quoted, ", "))
	return startPrometheusConfig(t, t.TempDir(), testenv.FreePort(t), func(string) string { return config })
}

// startPrometheusConfig runs Debian's prometheus on 127.0.0.1:port with the
// configuration config returns for its own address, config and data in
// dir, and returns once /-/ready answers (deadline 60 s).
func startPrometheusConfig(t testing.TB, dir string, port int, config func(addr string) string) *server {
	t.Helper()
	bin := requireTool(t, "prometheus")
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config(addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	url := "http://" + addr
	proc := testenv.Start(t, []string{"PATH=/usr/bin:/bin", "HOME=" + dir}, dir, bin,
		"--config.file="+cfg,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--web.console.templates="+filepath.Join(dir, "consoles"),
		"--web.console.libraries="+filepath.Join(dir, "console_libraries"),
		"--log.level=warn")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus output:\n%s", proc.Output())
		}
	})
	client, err := promapi.NewClient(promapi.Config{Address: url})
	if err != nil {
		t.Fatal(err)
	}
	s := &server{proc: proc, url: url, api: promv1.NewAPI(client), started: time.Now()}
	testenv.Poll(t, 60*time.Second, "prometheus ready on "+url, func() bool {
		if proc.Exited() {
			t.Fatalf("prometheus exited:\n%s", proc.Output())
		}
		resp, err := http.Get(url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return s
}

// query evaluates expr now; a failed query fails the test (bad PromQL is a
// bug in what we ship, not a condition to wait out).
func (s *server) query(t testing.TB, expr string) model.Vector {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, warnings, _, err := s.api.Query(ctx, expr, time.Now())
	if err != nil {
		t.Fatalf("query %s: %v", expr, err)
	}
	if len(warnings) > 0 {
		t.Logf("query %s: warnings %v", expr, warnings)
	}
	switch v := v.(type) {
	case model.Vector:
		return v
	case *model.Scalar:
		return model.Vector{{Metric: model.Metric{}, Value: v.Value, Timestamp: v.Timestamp}}
	default:
		t.Fatalf("query %s: %s result, want a vector", expr, v.Type())
		return nil
	}
}

// waitQuery polls expr until check accepts its result (deadline 30 s) and
// returns that result.
func (s *server) waitQuery(t testing.TB, expr, what string, check func(model.Vector) bool) model.Vector {
	t.Helper()
	return s.waitQueryFor(t, 30*time.Second, expr, what, check)
}

// waitQueryFor is waitQuery with the deadline given.
func (s *server) waitQueryFor(t testing.TB, timeout time.Duration, expr, what string, check func(model.Vector) bool) model.Vector {
	t.Helper()
	var last model.Vector
	deadline := time.Now().Add(timeout)
	for {
		last = s.query(t, expr)
		if check(last) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s = %v", timeout, what, expr, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scrapeText GETs a /metrics page.
func scrapeText(t testing.TB, addr string) (string, error) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(resp.Status)
	}
	return string(b), nil
}
