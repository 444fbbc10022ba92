package metrics

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// getWith GETs /metrics with the given Authorization headers.
func getWith(t *testing.T, srv *Server, auth ...string) reply {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+srv.Addr().String()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range auth {
		req.Header.Add("Authorization", a)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(body)}
}

// TestNotebooksOnlyWithToken: a scrape without the token gets no notebook
// path and no kernel id, but every per-user and GPU series (which the alert
// rules fall back to); with it, everything; with a wrong one, nothing.
func TestNotebooksOnlyWithToken(t *testing.T) {
	const token = "0123456789abcdef0123"
	m := New(&fakeSource{snap: testSnapshot()}, zerolog.New(io.Discard))
	m.NotebooksOnlyWith(token)
	srv := serve(t, m.Handler(), "127.0.0.1:0", false)
	leaks := []string{"kernel_id=", "notebook=", "/home/alice/a.ipynb", "kernel-a", "kernel-b"}

	open := getWith(t, srv)
	if open.status != 200 {
		t.Fatalf("no token: %d %s", open.status, open.body)
	}
	for _, l := range leaks {
		if strings.Contains(open.body, l) {
			t.Errorf("a scrape without the token shows %q", l)
		}
	}
	for _, want := range []string{`gpumem_user_gpu_memory_bytes{gpu="0",user="alice"}`, "gpumem_sample_success 1", "gpumem_gpu_memory_used_bytes{",
		`gpumem_gpu_sm_utilization_ratio{gpu="0"}`, `gpumem_reclaim_left_running_total{reason="computing"}`} {
		if !strings.Contains(open.body, want) {
			t.Errorf("a scrape without the token lacks %q", want)
		}
	}
	full := getWith(t, srv, "Bearer "+token)
	if full.status != 200 || !strings.Contains(full.body, `kernel_id="kernel-a"`) || !strings.Contains(full.body, "/home/alice/a.ipynb") {
		t.Errorf("with the token: %d, want the per-notebook series:\n%s", full.status, full.body)
	}
	for _, bad := range [][]string{{"Bearer wrong-token-wrong-token"}, {"Basic " + token}, {"Bearer " + token, "Bearer " + token}, {"Bearer"}} {
		r := getWith(t, srv, bad...)
		if r.status != http.StatusUnauthorized || strings.Contains(r.body, "kernel") {
			t.Errorf("Authorization %q: %d %q, want 401 and nothing", bad, r.status, r.body)
		}
	}
}

func TestReadTokenFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "0123456789abcdef0123\n", 0o600)
	if tok, err := ReadTokenFile(good); err != nil || tok != "0123456789abcdef0123" {
		t.Fatalf("ReadTokenFile = %q, %v", tok, err)
	}
	for _, tc := range []struct{ path, err string }{
		{write("open", "0123456789abcdef0123\n", 0o644), "lets others read or change it"},
		{write("short", "abc\n", 0o600), "shorter than 16"},
		{write("two", "0123456789abcdef0123 x\n", 0o600), "alone on one line"},
		{dir, "not a regular file"},
		{filepath.Join(dir, "none"), "no such file"},
	} {
		if _, err := ReadTokenFile(tc.path); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("ReadTokenFile(%s) = %v, want %q", tc.path, err, tc.err)
		}
	}
}
