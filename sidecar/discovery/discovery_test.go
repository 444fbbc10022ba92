package discovery

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/procs"
)

func TestParseServerFile(t *testing.T) {
	tests := []struct {
		name, file, data string
		want             Server
		wantErr          string
	}{
		{
			name: "jupyter_server", file: "/r/jpserver-12.json",
			data: `{"base_url":"/","hostname":"127.0.0.1","password":false,"pid":12,"port":8888,"root_dir":"/home/a","secure":false,"sock":"","token":"t0k","url":"http://127.0.0.1:8888/","version":"1.23.3"}`,
			want: Server{File: "/r/jpserver-12.json", Kind: "jupyter_server", URL: "http://127.0.0.1:8888/", Token: "t0k", RootDir: "/home/a", PID: 12, Version: "1.23.3"},
		},
		{
			name: "notebook 6 uses notebook_dir", file: "/r/nbserver-7.json",
			data: `{"base_url":"/","notebook_dir":"/srv/nb","pid":7,"port":8890,"token":"x","url":"http://localhost:8890/nb"}`,
			want: Server{File: "/r/nbserver-7.json", Kind: "notebook", URL: "http://localhost:8890/nb/", Token: "x", RootDir: "/srv/nb", PID: 7},
		},
		{name: "not json", file: "/r/jpserver-1.json", data: `{"url":`, wantErr: "jpserver-1.json: not valid JSON"},
		{name: "no url", file: "/r/jpserver-2.json", data: `{"pid":2}`, wantErr: `jpserver-2.json: no "url"`},
		{name: "wrong types", file: "/r/jpserver-3.json", data: `{"url":5}`, wantErr: "jpserver-3.json: not valid JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseServerFile(tc.file, []byte(tc.data))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestNotebookPath(t *testing.T) {
	s := Server{RootDir: "/srv/nb"}
	for in, want := range map[string]string{
		"a.ipynb":            "/srv/nb/a.ipynb",
		"x/y/z.ipynb":        "/srv/nb/x/y/z.ipynb",
		"../../etc/passwd":   "/srv/nb/etc/passwd",
		"with space/ü.ipynb": "/srv/nb/with space/ü.ipynb",
		"":                   "",
	} {
		if got := s.notebookPath(in); got != want {
			t.Errorf("notebookPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRuntimeDirs(t *testing.T) {
	env := map[string]string{"HOME": "/home/u"}
	get := func(k string) string { return env[k] }
	if got := defaultRuntimeDir(get); got != "/home/u/.local/share/jupyter/runtime" {
		t.Errorf("default = %q", got)
	}
	env["XDG_DATA_HOME"] = "/x"
	if got := defaultRuntimeDir(get); got != "/x/jupyter/runtime" {
		t.Errorf("xdg = %q", got)
	}
	env["JUPYTER_RUNTIME_DIR"] = "/rt"
	got := RuntimeDirs(get, []string{"/rt/", "/other", ""})
	if strings.Join(got, " ") != "/rt /other" {
		t.Errorf("RuntimeDirs = %q", got)
	}
}

// TestDiscoverRealServers runs Notebook 6 and jupyter_server with sessions in
// nested folders, plus a kernel without a server in the same runtime dir.
func TestDiscoverRealServers(t *testing.T) {
	for _, kind := range testenv.ServerKinds() {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartServer(t, kind)
			paths := []string{"top.ipynb", "a/b/deep.ipynb", "with space/ü.ipynb"}
			want := map[string]string{} // kernel id -> absolute notebook
			for _, p := range paths {
				sess := srv.CreateSession(t, p)
				want[sess.Kernel.ID] = filepath.Join(srv.RootDir, filepath.FromSlash(p))
			}
			bare := testenv.StartKernel(t, srv.Dir)
			// A frontend's first cell returns once the kernel has bound its ports.
			testenv.RunCell(t, bare.ConnectionFile, "pass", 60*time.Second)

			res := Discover(context.Background(), Options{
				RuntimeDirs: []string{srv.RuntimeDir()},
				Procs:       NewProcFinder(&procs.FS{}),
			})
			if len(res.Problems) > 0 {
				t.Fatalf("problems: %v", res.Problems)
			}
			if len(res.Servers) != 1 || res.Servers[0].URL != srv.URL || res.Servers[0].RootDir != srv.RootDir {
				t.Fatalf("servers = %+v, want one at %s root %s", res.Servers, srv.URL, srv.RootDir)
			}
			if len(res.Kernels) != len(paths)+1 {
				t.Fatalf("found %d kernels, want %d: %+v", len(res.Kernels), len(paths)+1, res.Kernels)
			}
			for _, k := range res.Kernels {
				if k.ID == bare.ID {
					if k.Notebook != "" || k.ServerURL != "" {
						t.Errorf("bare kernel: notebook %q server %q, want none", k.Notebook, k.ServerURL)
					}
					if k.PID != bare.Cmd.Process.Pid {
						t.Errorf("bare kernel pid = %d, want %d", k.PID, bare.Cmd.Process.Pid)
					}
					continue
				}
				if k.Notebook != want[k.ID] {
					t.Errorf("kernel %s: notebook %q, want %q", k.ID, k.Notebook, want[k.ID])
				}
				if k.ServerURL != srv.URL {
					t.Errorf("kernel %s: server %q, want %q", k.ID, k.ServerURL, srv.URL)
				}
				if pid := testenv.KernelPID(t, k.ConnectionFile); k.PID != pid {
					t.Errorf("kernel %s (%s): pid %d, kernel says %d", k.ID, k.Notebook, k.PID, pid)
				}
			}
		})
	}
}

func TestDiscoverReportsBrokenFilesAndDeadServers(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("kernel-broken.json", `{"shell_port": `)
	write("kernel-curve.json", `{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256","curve_publickey":"x"}`)
	write("kernel-good.json", `{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`)
	port := testenv.FreePort(t) // nothing listens there
	write("jpserver-1.json", `{"url":"http://127.0.0.1:`+strconv.Itoa(port)+`/","token":"t","root_dir":"/x","pid":1}`)
	write("nbserver-2.json", `garbage`)

	res := Discover(context.Background(), Options{RuntimeDirs: []string{dir, filepath.Join(dir, "missing")}})
	if len(res.Kernels) != 1 || res.Kernels[0].ID != "good" {
		t.Fatalf("kernels = %+v, want only 'good'", res.Kernels)
	}
	all := ""
	for _, p := range res.Problems {
		all += p.Error() + "\n"
	}
	for _, want := range []string{"kernel-broken.json", "kernel-curve.json", "CURVE encryption is not supported", "nbserver-2.json", "does not answer"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems do not mention %q:\n%s", want, all)
		}
	}
}

// A server file read in the middle of its server's write is read again
// before it counts as broken.
func TestServerFileReadAgain(t *testing.T) {
	full := `{"url":"http://127.0.0.1:8888/","token":"t","root_dir":"/r","pid":42}`
	reads := 0
	read := func(string) ([]byte, error) {
		reads++
		if reads == 1 {
			return []byte(full[:20]), nil // cut short: the server is writing it
		}
		return []byte(full), nil
	}
	s, err := readServerFile(context.Background(), "/r/jpserver-42.json", read, time.Millisecond)
	if err != nil || s.URL != "http://127.0.0.1:8888/" || reads != 2 {
		t.Fatalf("server %+v, err %v after %d reads; want it parsed on the second read", s, err, reads)
	}
	reads = 0
	broken := func(string) ([]byte, error) { reads++; return []byte("{"), nil }
	if _, err := readServerFile(context.Background(), "/r/jpserver-42.json", broken, time.Millisecond); err == nil || reads != 2 {
		t.Fatalf("a file broken on both reads: err %v after %d reads", err, reads)
	}
}

type aliveSet map[int]bool

func (a aliveSet) Alive(pid int) bool { return a[pid] }

// gpumem never advises deleting the file of a server whose process lives.
func TestFileAdvice(t *testing.T) {
	base := errors.New("server file /r/jpserver-7.json: not valid JSON (unexpected end of JSON input)")
	for _, tc := range []struct {
		name  string
		pid   int
		pc    ProcessChecker
		want  string
		never string
	}{
		{"process lives", 7, aliveSet{7: true}, "its server (pid 7) is running: leave the file", "delete"},
		{"process gone", 7, aliveSet{}, "its server (pid 7) is gone: delete the file", "running"},
		{"no pid", 0, aliveSet{}, base.Error(), "delete"},
		{"cannot tell", 7, nil, base.Error(), "delete"},
	} {
		got := fileAdvice(base, tc.pid, tc.pc).Error()
		if !strings.Contains(got, tc.want) || strings.Contains(got, tc.never) {
			t.Errorf("%s: %q; want %q, never %q", tc.name, got, tc.want, tc.never)
		}
	}
	if serverFilePID("/r/jpserver-123.json") != 123 || serverFilePID("/r/nbserver-9.json") != 9 || serverFilePID("/r/jpserver-x.json") != 0 {
		t.Error("serverFilePID")
	}
}

// Discover end to end: a broken jpserver file whose process (this test)
// lives is not to be deleted; one whose process is gone is.
func TestDiscoverServerFileOfLiveProcess(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, fmt.Sprintf("jpserver-%d.json", os.Getpid()))
	dead := filepath.Join(dir, "jpserver-999999999.json")
	for _, f := range []string{live, dead} {
		if err := os.WriteFile(f, []byte(`{"url":"http://127.0.0.1:1/","tok`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	res := Discover(context.Background(), Options{RuntimeDirs: []string{dir}, Procs: NewProcFinder(&procs.FS{})})
	var all []string
	for _, p := range res.Problems {
		all = append(all, p.Error())
	}
	text := strings.Join(all, "\n")
	for _, p := range all {
		switch {
		case strings.Contains(p, live):
			if strings.Contains(p, "delete") || !strings.Contains(p, "is running") {
				t.Errorf("live server's file: %q", p)
			}
		case strings.Contains(p, dead):
			if !strings.Contains(p, "is gone: delete the file") {
				t.Errorf("dead server's file: %q", p)
			}
		}
	}
	if !strings.Contains(text, live) || !strings.Contains(text, dead) {
		t.Fatalf("problems do not name both files:\n%s", text)
	}
}
