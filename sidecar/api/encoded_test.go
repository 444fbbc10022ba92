package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
)

// encodingBackend hands out its report pre-encoded (Backend.ReportJSON).
type encodingBackend struct {
	*fakeBackend
	body []byte
	err  error
}

func (b *encodingBackend) ReportJSON(context.Context) ([]byte, error) { return b.body, b.err }

// /api/v1/notebooks sends a Backend's ReportJSON bytes as they are, with the
// newline every reply ends with, and a 503 when it has no report.
func TestNotebooksServesEncodedReport(t *testing.T) {
	fb := &fakeBackend{report: testReport()}
	body, err := json.Marshal(fb.report)
	if err != nil {
		t.Fatal(err)
	}
	b := &encodingBackend{fakeBackend: fb, body: body}
	ts := startServer(t, "", ModePrivate, b)
	r := rawDo(t, ts.path, http.MethodGet, "/api/v1/notebooks", "", nil, "")
	if r.status != http.StatusOK || !bytes.Equal(r.body, append(bytes.Clone(body), '\n')) {
		t.Errorf("GET /api/v1/notebooks = %d %q, want the encoded report", r.status, r.body)
	}
	if got := r.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}
	if len(body) > 0 && body[len(body)-1] == '\n' {
		t.Fatal("json.Marshal ended with a newline")
	}
	b.body, b.err = nil, errors.New("no sample yet")
	if r := rawDo(t, ts.path, http.MethodGet, "/api/v1/notebooks", "", nil, ""); r.status != http.StatusServiceUnavailable {
		t.Errorf("without a report: %d %s", r.status, r.body)
	}
}
