package discovery

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFlaggedConnectionFile(t *testing.T) {
	tests := []struct {
		argv []string
		want string
	}{
		{[]string{"python", "-m", "ipykernel_launcher", "-f", "/tmp/tmpab12.json"}, "/tmp/tmpab12.json"},
		{[]string{"/usr/bin/python3", "/x/ipykernel_launcher.py", "-f", "rel.json", "--HistoryManager.hist_file=:memory:"}, "rel.json"},
		{[]string{"python", "-m", "ipykernel", "--f=/run/k.json"}, "/run/k.json"},
		{[]string{"R", "--slave", "-e", "IRkernel::main()", "--args", "--connection-file=/r/k.json"}, "/r/k.json"},
		// A frontend naming the file, and other programs' -f, bare or not JSON.
		{[]string{"jupyter-console", "--existing", "/tmp/k.json"}, ""},
		{[]string{"jq", "-f", "filter.jq"}, ""},
		{[]string{"python", "-f"}, ""},
		{nil, ""},
	}
	for _, tc := range tests {
		if got := flaggedConnectionFile(tc.argv); got != tc.want {
			t.Errorf("flaggedConnectionFile(%q) = %q, want %q", tc.argv, got, tc.want)
		}
	}
}

func TestPapermillInput(t *testing.T) {
	cwd := func() string { return "/home/a/jobs" }
	tests := []struct {
		argv []string
		want string
	}{
		{[]string{"/venv/bin/python", "/venv/bin/papermill", "-k", "python3", "in.ipynb", "out.ipynb"}, "/home/a/jobs/in.ipynb"},
		{[]string{"papermill", "/abs/in.ipynb", "/abs/out.ipynb", "-p", "alpha", "0.6"}, "/abs/in.ipynb"},
		{[]string{"python3", "-m", "papermill", "sub/../in.ipynb", "o.ipynb"}, "/home/a/jobs/in.ipynb"},
		{[]string{"papermill", "-p", "name", "x.ipynb", "--kernel", "py", "in.ipynb", "out.ipynb"}, "/home/a/jobs/in.ipynb"},
		// Remote or stdin input: nothing here names it, and never the output.
		{[]string{"papermill", "s3://bucket/in.ipynb", "out.ipynb"}, ""},
		{[]string{"papermill", "-", "out.ipynb"}, ""},
		{[]string{"jupyter-execute", "a.ipynb"}, ""},
		{[]string{"python", "train.py", "papermill", "x.ipynb"}, ""},
		{[]string{"papermill"}, ""},
	}
	for _, tc := range tests {
		if got := papermillInput(tc.argv, cwd); got != tc.want {
			t.Errorf("papermillInput(%q) = %q, want %q", tc.argv, got, tc.want)
		}
	}
}

func TestNameNotebooks(t *testing.T) {
	ks := []Kernel{
		{ID: "server", Notebook: "/srv/a.ipynb", NotebookFrom: "server", PIDProven: true, sessionName: "/old/name.ipynb"},
		{ID: "env", PIDProven: true, sessionName: "/srv/b.ipynb"},
		{ID: "relative", PIDProven: true, sessionName: "b.ipynb"},
		{ID: "unproven", PIDProven: false, sessionName: "/planted.ipynb"},
		{ID: "none", PIDProven: true},
	}
	nameNotebooks(nil, ks)
	want := map[string][2]string{
		"server":   {"/srv/a.ipynb", "server"},
		"env":      {"/srv/b.ipynb", "JPY_SESSION_NAME"},
		"relative": {"", ""},
		"unproven": {"", ""},
		"none":     {"", ""},
	}
	for _, k := range ks {
		if got := [2]string{k.Notebook, k.NotebookFrom}; got != want[k.ID] {
			t.Errorf("kernel %s: notebook %q from %q, want %q", k.ID, got[0], got[1], want[k.ID])
		}
	}
}

// TestServerOnUnixSocket: a server whose URL is http+unix:// is asked over
// that socket, its base_url kept.
func TestServerOnUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "gpumem-sock-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var gotPath, gotAuth string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotAuth = r.URL.Path, r.Header.Get("Authorization")
		_, _ = w.Write([]byte(`[{"id":"s","path":"x.ipynb","kernel":{"id":"k"}}]`))
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	defer func() { _ = srv.Close(); <-done }()

	s, err := parseServerFile(filepath.Join(dir, "jpserver-1.json"), []byte(`{"url":"http+unix://`+url.PathEscape(sock)+`/user/alice/","token":"t","root_dir":"/r","password":false}`))
	if err != nil {
		t.Fatal(err)
	}
	s.FileUID = uint32(os.Geteuid()) // the socket's listener: this process
	sessions, err := s.Sessions(context.Background(), &http.Client{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) != 1 || sessions[0].Kernel.ID != "k" || gotPath != "/user/alice/api/sessions" || gotAuth != "token t" {
		t.Fatalf("sessions %+v, request %s with %q", sessions, gotPath, gotAuth)
	}
}

// TestServerWithoutToken: a password server with no token given is not
// asked at all (one error, at once); a token given is used.
func TestServerWithoutToken(t *testing.T) {
	s, err := parseServerFile("/r/jpserver-9.json", []byte(`{"url":"http://127.0.0.1:9/","token":"","password":true,"root_dir":"/r"}`))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = s.Sessions(context.Background(), &http.Client{Timeout: 5 * time.Second})
	if !errors.Is(err, ErrNoToken) || !strings.Contains(err.Error(), "GPUMEM_SERVER_TOKEN") || !strings.Contains(err.Error(), "jpserver-9.json") {
		t.Fatalf("err = %v, want ErrNoToken naming the file and GPUMEM_SERVER_TOKEN", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("took %v: a password server must not be asked", took)
	}
}

// A process passing a runtime dir's kernel-*.json file is not looked at
// (its environ read) as a kernel launched elsewhere: the dir's own scan
// reads that file. Any other file it passes still is.
func TestInRuntimeDir(t *testing.T) {
	dirs := map[string]bool{"/home/a/.local/share/jupyter/runtime": true}
	for arg, want := range map[string]bool{
		"/home/a/.local/share/jupyter/runtime/kernel-1.json":            true,
		"/home/a/.local/share/jupyter/runtime/../runtime/kernel-1.json": true,
		"/home/a/.local/share/jupyter/runtime/other.json":               false,
		"/home/a/.local/share/jupyter/runtime/sub/kernel-1.json":        false,
		"/tmp/tmpab12.json":  false,
		"kernel-1.json":      false, // relative: as the process sees it
		"/tmp/kernel-1.json": false,
	} {
		if got := inRuntimeDir(arg, dirs); got != want {
			t.Errorf("%s: %v, want %v", arg, got, want)
		}
	}
}

// TestServerLastActivity: a server's own last activity comes from GET
// /api/status with its token; a status that is not one is an error naming
// the server.
func TestServerLastActivity(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	if len(sock) > 100 { // a unix socket path's limit
		d, err := os.MkdirTemp("", "gpumem-sock-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		sock = filepath.Join(d, "s.sock")
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"started":"2026-12-03T08:00:00.000000Z","last_activity":"2026-12-03T12:34:56.789000Z","connections":0,"kernels":1}`
	var gotPath, gotAuth string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotAuth = r.URL.Path, r.Header.Get("Authorization")
		_, _ = w.Write([]byte(body))
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	defer func() { _ = srv.Close(); <-done }()
	s, err := parseServerFile(filepath.Join(dir, "jpserver-1.json"), []byte(`{"url":"http+unix://`+url.PathEscape(sock)+`/","token":"t","root_dir":"/r","password":false}`))
	if err != nil {
		t.Fatal(err)
	}
	s.FileUID = uint32(os.Geteuid())
	hc := &http.Client{Timeout: 5 * time.Second}
	at, err := s.LastActivity(context.Background(), hc)
	want := time.Date(2026, 12, 3, 12, 34, 56, 789000000, time.UTC)
	if err != nil || !at.Equal(want) || gotPath != "/api/status" || gotAuth != "token t" {
		t.Fatalf("LastActivity = %v, %v (request %s with %q); want %v", at, err, gotPath, gotAuth, want)
	}
	body = `{"last_activity":"soon"}`
	if _, err := s.LastActivity(context.Background(), hc); err == nil || !strings.Contains(err.Error(), "jpserver-1.json") {
		t.Fatalf("a bad status: %v, want an error naming the server's file", err)
	}
}
