package api

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// GET /api/v1/notebooks carries the report's schema, in the whole report
// and in a user's own view of it (which the API builds anew).
func TestNotebooksCarrySchema(t *testing.T) {
	ts := startServer(t, "", ModePrivate, &fakeBackend{report: testReport()})
	r := rawDo(t, ts.path, http.MethodGet, "/api/v1/notebooks", SocketHost, nil, "")
	var got struct {
		Schema *int `json:"schema"`
	}
	if err := json.Unmarshal(r.body, &got); err != nil || r.status != http.StatusOK {
		t.Fatalf("GET /api/v1/notebooks: %d %q: %v", r.status, r.body, err)
	}
	if got.Schema == nil || *got.Schema != attribution.ReportSchema {
		t.Errorf("GET /api/v1/notebooks: schema %v, want %d: %s", got.Schema, attribution.ReportSchema, r.body)
	}
	if v := ownView(testReport(), "alice"); v.Schema != attribution.ReportSchema {
		t.Errorf("a user's own view has schema %d, want %d", v.Schema, attribution.ReportSchema)
	}
}
