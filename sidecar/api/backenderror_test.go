package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// backendError is how every endpoint that shares it answers a backend's
// error: the status and the message each error gets, and no answer at all
// for no error.
func TestBackendError(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int // 0: nothing written
		wantMsg    string
	}{
		{"no error", nil, 0, ""},
		{"not served", fmt.Errorf("oom: %w", ErrNotServed), http.StatusNotFound, "this backend serves none"},
		{"too many", fmt.Errorf("kernel k: 9 in a minute: %w", ErrTooMany), http.StatusTooManyRequests, "kernel k: 9 in a minute: too many reports"},
		{"kernel not found", fmt.Errorf("kernel k: %w", ErrKernelNotFound), http.StatusNotFound, "kernel k: " + ErrKernelNotFound.Error()},
		{"any other", errors.New("the daemon is stopping"), http.StatusServiceUnavailable, "the daemon is stopping"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Server{}
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodGet, "/api/v1/oom", nil)
			wrote := s.backendError(w, r, tt.err, "this backend serves none")
			if wrote != (tt.wantStatus != 0) {
				t.Fatalf("backendError(%v) = %v, want %v", tt.err, wrote, tt.wantStatus != 0)
			}
			if tt.wantStatus == 0 {
				if w.Body.Len() != 0 {
					t.Fatalf("no error, yet it wrote %q", w.Body.String())
				}
				return
			}
			if w.Code != tt.wantStatus {
				t.Errorf("status %d, want %d", w.Code, tt.wantStatus)
			}
			var body errorBody
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", w.Body.String(), err)
			}
			if body.Error != tt.wantMsg {
				t.Errorf("message %q, want %q", body.Error, tt.wantMsg)
			}
		})
	}
}
