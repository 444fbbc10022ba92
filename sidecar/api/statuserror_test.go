package api

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestStatusErrorSaysNoHTTPStatus: what a user reads of a refused call
// is the daemon's reason and the next step, never the transport's code.
func TestStatusErrorSaysNoHTTPStatus(t *testing.T) {
	for _, tc := range []struct {
		code      int
		msg, want string
	}{
		{http.StatusBadRequest, "body: unknown field", "refused the request: body: unknown field (this gpumem and the daemon may be different versions"},
		{http.StatusForbidden, "kernel k is not user bob's", "the gpumem daemon refused: kernel k is not user bob's"},
		{http.StatusNotFound, "kernel k is not known to the daemon", "does not know it: kernel k is not known"},
		{http.StatusRequestEntityTooLarge, "body is over 1 bytes", "refused the request: body is over 1 bytes"},
		{http.StatusUnprocessableEntity, "no variable x", "refused the request: no variable x (nothing was changed)"},
		{http.StatusTooManyRequests, "uid 1 already has 8 requests", "the gpumem daemon is busy: uid 1 already has 8 requests"},
		{http.StatusTooManyRequests, "x", "(try again in a moment)"},
		{http.StatusInternalServerError, "boom", "failed: boom (gpumem serve's log says more"},
		{http.StatusBadGateway, "kernel k: closed", "the kernel did not answer the gpumem daemon: kernel k: closed"},
		{http.StatusServiceUnavailable, "history: off", "failed: history: off"},
		{http.StatusGatewayTimeout, "kernel k did not run the free", "timed out: kernel k did not run the free"},
		{http.StatusUnprocessableEntity, "", "refused the request: it gave no reason"},
	} {
		got := (&StatusError{StatusCode: tc.code, Message: tc.msg}).Error()
		if !strings.Contains(got, tc.want) {
			t.Errorf("%d %q: got %q, want it to contain %q", tc.code, tc.msg, got, tc.want)
		}
		if strings.Contains(got, strconv.Itoa(tc.code)) || strings.Contains(got, http.StatusText(tc.code)) {
			t.Errorf("%d %q: %q names the HTTP status", tc.code, tc.msg, got)
		}
	}
}
