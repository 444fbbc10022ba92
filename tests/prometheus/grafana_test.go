package prometheus

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// dashboard is the part of a Grafana dashboard's JSON the test reads.
type dashboard struct {
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panelJSON `json:"panels"`
}

type panelJSON struct {
	ID         int                   `json:"id"`
	Type       string                `json:"type"`
	Title      string                `json:"title"`
	Datasource *struct{ UID string } `json:"datasource"`
	Targets    []struct {
		RefID   string `json:"refId"`
		Expr    string `json:"expr"`
		Instant bool   `json:"instant"`
	} `json:"targets"`
	Panels []panelJSON `json:"panels"` // a collapsed row's
}

var labelValuesRE = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// dashboardQuery is one query of a dashboard panel, its template
// variables substituted.
type dashboardQuery struct {
	panel, refID, expr string
	raw                string // as the dashboard writes it
	instant            bool   // Grafana asks for the value now, not a range
}

// dashboardQueries reads the Grafana dashboard at path and returns every
// panel query as Grafana would send it with every template variable on
// "All", and checks each panel's datasource.
//
// Substitutions: a query variable takes all the values its label_values()
// returns now, joined as the regex Grafana builds for "All"; $__interval is
// interval (the scrape interval), $__rate_interval four of them, $__range
// the time Prometheus has run; the idle window is idleWindow (a test's
// Prometheus has minutes of data, not the dashboard's hours).
func dashboardQueries(t testing.TB, prom *server, path string, interval time.Duration, idleWindow string) []dashboardQuery {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	vars := map[string]string{
		"__interval":      promDuration(interval),
		"__rate_interval": promDuration(4 * interval),
		"__range":         fmt.Sprintf("%ds", int(time.Since(prom.started).Seconds())),
	}
	substitute := func(s string) string {
		names := make([]string, 0, len(vars))
		for n := range vars {
			names = append(names, n)
		}
		// Longest first, so $user never eats the start of $user_group.
		sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
		for _, n := range names {
			s = strings.ReplaceAll(s, "${"+n+"}", vars[n])
			s = strings.ReplaceAll(s, "$"+n, vars[n])
		}
		return s
	}
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			vars[v.Name] = "prometheus"
		case "custom":
			if v.Name != "idle_window" {
				t.Fatalf("custom variable %s: the test does not know what to give it", v.Name)
			}
			vars[v.Name] = idleWindow
		case "query":
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Fatalf("variable %s: query %s: %v", v.Name, v.Query, err)
			}
			m := labelValuesRE.FindStringSubmatch(strings.TrimSpace(q.Query))
			if m == nil {
				t.Fatalf("variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
			}
			selector := substitute(m[1])
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			values, _, _, err := prom.api.LabelValues(ctx, m[2], []string{selector}, time.Now().Add(-time.Minute), time.Now())
			cancel()
			if err != nil || len(values) == 0 {
				t.Fatalf("variable %s: label_values(%s, %s) = %v, %v: want values", v.Name, selector, m[2], values, err)
			}
			// Grafana's "All": each value regex-quoted, then escaped for a
			// PromQL string.
			quoted := make([]string, len(values))
			for i, val := range values {
				quoted[i] = strings.ReplaceAll(regexp.QuoteMeta(string(val)), `\`, `\\`)
			}
			vars[v.Name] = "(" + strings.Join(quoted, "|") + ")"
			t.Logf("$%s: %d values", v.Name, len(values))
		default:
			t.Fatalf("variable %s of type %s: the test does not know it", v.Name, v.Type)
		}
	}

	var panels []panelJSON
	for _, p := range d.Panels {
		panels = append(panels, p)
		panels = append(panels, p.Panels...)
	}
	var out []dashboardQuery
	for _, p := range panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %d %q has no query", p.ID, p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %d %q: datasource %v, want the ${datasource} variable", p.ID, p.Title, p.Datasource)
		}
		for _, tg := range p.Targets {
			expr := substitute(tg.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("panel %q %s: unknown variable left in %s", p.Title, tg.RefID, expr)
				continue
			}
			out = append(out, dashboardQuery{panel: p.Title, refID: tg.RefID, expr: expr, raw: tg.Expr, instant: tg.Instant})
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no queries", path)
	}
	return out
}

// promDuration writes d as PromQL does (whole seconds, or milliseconds).
func promDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", int(d/time.Second))
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}

// checkDashboard evaluates every query of the Grafana dashboard at path
// against prom (dashboardQueries: a 1 s scrape, the idle window shrunk to
// 5 s so that a notebook whose memory stayed put during the test counts as
// idle), and fails for any that errs or returns no data.
func checkDashboard(t *testing.T, prom *server, path string) {
	t.Helper()
	queries := dashboardQueries(t, prom, path, time.Second, "5s")
	for _, q := range queries {
		// Windowed queries (the idle window, rates) need that much
		// history: poll, with a deadline well past the longest.
		v := prom.query(t, q.expr)
		for deadline := time.Now().Add(20 * time.Second); len(v) == 0 && time.Now().Before(deadline); {
			time.Sleep(250 * time.Millisecond)
			v = prom.query(t, q.expr)
		}
		if len(v) == 0 {
			t.Errorf("panel %q %s: no data within 20s from %s", q.panel, q.refID, q.expr)
			continue
		}
		t.Logf("panel %q %s: %d series", q.panel, q.refID, len(v))
	}
	t.Logf("%d dashboard queries evaluated", len(queries))
}
