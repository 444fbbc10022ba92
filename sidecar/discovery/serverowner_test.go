package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// fakeListeners says every TCP listener belongs to uid.
type fakeListeners struct{ uid uint32 }

func (f fakeListeners) TCPListener(ip net.IP, port int) (procs.Listener, bool, error) {
	return procs.Listener{IP: ip, UID: f.uid}, true, nil
}

// recorder is a server that records what reaches it.
type recorder struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
}

func newRecorder(t *testing.T, sessions string) *recorder {
	r := &recorder{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auths = append(r.auths, req.Header.Get("Authorization"))
		r.mu.Unlock()
		_, _ = w.Write([]byte(sessions))
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *recorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.auths...)
}

// TestServerAskedOnlyThroughItsOwnersListener: a server file's url is its
// writer's choice, so a request goes there only when the listener belongs
// to the file's owner; otherwise nothing is sent, the token least of all.
func TestServerAskedOnlyThroughItsOwnersListener(t *testing.T) {
	rec := newRecorder(t, `[]`)
	me := uint32(os.Geteuid())
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, tc := range []struct {
		name      string
		listeners ListenerFinder
		fileUID   uint32
		url       string
		asked     bool
		err       string
	}{
		{"its owner's listener", fakeListeners{me}, me, rec.URL + "/", true, ""},
		{"another user's listener", fakeListeners{me + 1}, me, rec.URL + "/", false, fmt.Sprintf("served by uid %d, but the file belongs to uid %d", me+1, me)},
		{"the real /proc: this process listens", nil, me, rec.URL + "/", true, ""},
		{"the real /proc, a file of another uid", nil, me + 1, rec.URL + "/", false, "not asked"},
		{"not this host", fakeListeners{me}, me, "http://192.0.2.1:8888/", false, "is not an address of this host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(rec.requests())
			s, err := parseServerFile("/home/u/rt/jpserver-1.json", []byte(`{"url":"`+tc.url+`","token":"file-token"}`))
			if err != nil {
				t.Fatal(err)
			}
			s.FileUID, s.listeners = tc.fileUID, tc.listeners
			_, err = s.Sessions(context.Background(), hc)
			asked := len(rec.requests()) > before
			if asked != tc.asked {
				t.Fatalf("asked = %v, want %v (err %v)", asked, tc.asked, err)
			}
			if tc.err == "" && err != nil {
				t.Fatalf("Sessions: %v", err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "jpserver-1.json")) {
				t.Fatalf("err = %v, want it to name the file and say %q", err, tc.err)
			}
		})
	}
	// A shutdown goes the same way.
	s := Server{URL: rec.URL + "/", File: "/home/u/rt/jpserver-1.json", Token: "t", FileUID: me, listeners: fakeListeners{me + 1}}
	before := len(rec.requests())
	if err := s.ShutdownKernel(context.Background(), hc, "k"); err == nil || !strings.Contains(err.Error(), "not asked") {
		t.Errorf("ShutdownKernel through another user's listener: %v", err)
	}
	if len(rec.requests()) != before {
		t.Error("the shutdown reached another user's listener")
	}
}

// TestUnixServerOfAnotherUser: a unix socket is asked only when the peer's
// credentials are the file's owner's.
func TestUnixServerOfAnotherUser(t *testing.T) {
	dir, err := os.MkdirTemp("", "gpumem-sock") // short: a socket path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	asked := 0
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked++
		mu.Unlock()
		_, _ = w.Write([]byte(`[]`))
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	defer func() { _ = srv.Close(); <-done }()
	s, err := parseServerFile(filepath.Join(dir, "jpserver-1.json"), []byte(`{"url":"http+unix://`+url.PathEscape(sock)+`/","token":"t"}`))
	if err != nil {
		t.Fatal(err)
	}
	s.FileUID = uint32(os.Geteuid()) + 1
	_, err = s.Sessions(context.Background(), &http.Client{Timeout: 5 * time.Second})
	if !errors.Is(err, errForeignListener) || !strings.Contains(err.Error(), "not asked") {
		t.Fatalf("err = %v, want not asked", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if asked != 0 {
		t.Fatalf("the socket of another uid got %d requests", asked)
	}
}

func TestTokenPatterns(t *testing.T) {
	pats, err := ParseTokenPatterns("http://127.0.0.1:*/user/, https://Hub.example:8443/ http+unix://%2Frun%2Fhub.sock/user/")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		url  string
		want bool
	}{
		{"http://127.0.0.1:53211/user/alice/", true},
		{"http://127.0.0.1:8888/user/", true},
		{"http://127.0.0.1:8888/users/alice/", false}, // a path prefix, not a string prefix
		{"http://127.0.0.1:8888/", false},
		{"http://localhost:8888/user/alice/", false}, // another host name
		{"https://127.0.0.1:53211/user/alice/", false},
		{"https://hub.example:8443/x/", true},
		{"https://hub.example/x/", false}, // port 443
		{"http+unix://%2Frun%2Fhub.sock/user/bob/", true},
		{"http+unix://%2Ftmp%2Fevil.sock/user/bob/", false},
		{"not a url", false},
	} {
		if got := tokenMeantFor(pats, tc.url); got != tc.want {
			t.Errorf("tokenMeantFor(%q) = %v, want %v", tc.url, got, tc.want)
		}
	}
	if tokenMeantFor(nil, "http://127.0.0.1:8888/") {
		t.Error("no pattern: the token is for no server")
	}
	for _, bad := range []string{"127.0.0.1:8888", "ftp://x:1/", "http://:8888/", "http:///"} {
		if _, err := ParseTokenPatterns(bad); err == nil {
			t.Errorf("ParseTokenPatterns(%q) accepted", bad)
		}
	}
}

// TestSessionsNameOnlyTheirOwnersKernels: a server's sessions name only
// kernels of its own dir whose files belong to its file's owner. Bob's
// server file listing alice's kernel id changes nothing of hers.
func TestSessionsNameOnlyTheirOwnersKernels(t *testing.T) {
	const alice, bob = 2000, 3000
	sessions := `[{"id":"s","path":"stolen.ipynb","kernel":{"id":"K","execution_state":"idle","last_activity":"2001-01-01T00:00:00Z"}},
		{"id":"t","path":"own.ipynb","kernel":{"id":"B","execution_state":"idle","last_activity":"2001-01-01T00:00:00Z"}}]`
	rec := newRecorder(t, sessions)
	bobs := Server{File: "/home/bob/rt/jpserver-1.json", URL: rec.URL + "/", Token: "t", RootDir: "/home/bob", FileUID: bob, listeners: fakeListeners{bob}}
	kernels := []Kernel{
		{ID: "K", ConnectionFile: "/home/alice/rt/kernel-K.json", FileUID: alice},
		// Alice's kernel seen through a link in bob's dir would be of uid alice.
		{ID: "K", ConnectionFile: "/home/bob/rt/kernel-K.json", FileUID: alice},
		{ID: "B", ConnectionFile: "/home/bob/rt/kernel-B.json", FileUID: bob},
		{ID: "B", ConnectionFile: "/tmp/kernel-B.json", FileUID: bob, outside: true},
	}
	answers := fetchSessions(context.Background(), &http.Client{Timeout: 5 * time.Second}, Options{ServerTimeout: 5 * time.Second}, []Server{bobs})
	if problems := applySessions(answers(), kernels, nil); len(problems) > 0 {
		t.Fatal(problems)
	}
	for i, k := range kernels {
		own := i == 2
		if named := k.Notebook != "" || k.ServerURL != "" || !k.LastActivity.IsZero(); named != own {
			t.Errorf("%s (uid %d): notebook %q server %q last activity %v; named by bob's server: %v, want %v",
				k.ConnectionFile, k.FileUID, k.Notebook, k.ServerURL, k.LastActivity, named, own)
		}
	}
	if kernels[2].Notebook != "/home/bob/own.ipynb" {
		t.Errorf("bob's own kernel: notebook %q", kernels[2].Notebook)
	}
}

func TestDedupeServersKeepsEachOwner(t *testing.T) {
	in := []Server{{URL: "http://127.0.0.1:1/", FileUID: 3000, File: "bob"}, {URL: "http://127.0.0.1:1/", FileUID: 2000, File: "alice"},
		{URL: "http://127.0.0.1:1/", FileUID: 2000, File: "alice again"}}
	out := dedupeServers(in)
	if len(out) != 2 || out[0].File != "bob" || out[1].File != "alice" {
		t.Fatalf("dedupeServers = %+v, want bob's and alice's", out)
	}
}

// TestDiscoverRefusesLinksAndForeignFiles: in a dir of one user, a link in
// a kernel or server file's place is not followed, and a file of another
// user (a hard link to theirs, say) is not read.
func TestDiscoverRefusesLinksAndForeignFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	const user, other = 4242, 4343
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	conn := `{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"secret","signature_scheme":"hmac-sha256"}`
	theirs := filepath.Join(victim, "kernel-theirs.json")
	if err := os.WriteFile(theirs, []byte(conn), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "runtime")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name string, uid int) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(conn), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	write("kernel-own.json", user)
	write("kernel-foreign.json", other)
	if err := os.Symlink(theirs, filepath.Join(dir, "kernel-link.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(victim, "jpserver-1.json"), filepath.Join(dir, "jpserver-9.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, other, other); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, user, user); err != nil {
		t.Fatal(err)
	}
	res := Discover(context.Background(), Options{RuntimeDirs: []string{dir}})
	var ids []string
	for _, k := range res.Kernels {
		ids = append(ids, k.ID)
	}
	if strings.Join(ids, " ") != "own" {
		t.Errorf("kernels %v, want only own", ids)
	}
	all := fmt.Sprint(res.Problems)
	for _, want := range []string{"kernel-link.json: a symbolic link, not followed", "jpserver-9.json: a symbolic link, not followed",
		"kernel-foreign.json belongs to uid " + strconv.Itoa(other) + ", but its dir to uid " + strconv.Itoa(user)} {
		if !strings.Contains(all, want) {
			t.Errorf("problems lack %q: %s", want, all)
		}
	}
}

// TestTokenNotSentWithoutItsURLs: GPUMEM_SERVER_TOKEN goes to the servers
// GPUMEM_SERVER_TOKEN_URLS names, never to the rest; without the list it
// goes to none, and Discover says so.
func TestTokenNotSentWithoutItsURLs(t *testing.T) {
	hub, fake := newRecorder(t, `[]`), newRecorder(t, `[]`)
	dir := t.TempDir()
	for i, r := range []*recorder{hub, fake} {
		f := filepath.Join(dir, "jpserver-"+strconv.Itoa(i)+".json")
		if err := os.WriteFile(f, []byte(`{"url":"`+r.URL+`/user/x/","token":""}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hubPort := strings.TrimPrefix(hub.URL, "http://127.0.0.1:")
	pats, err := ParseTokenPatterns("http://127.0.0.1:" + hubPort + "/user/")
	if err != nil {
		t.Fatal(err)
	}
	res := Discover(context.Background(), Options{RuntimeDirs: []string{dir}, ServerToken: "hub-token", ServerTokenURLs: pats})
	if got := hub.requests(); len(got) != 1 || got[0] != "token hub-token" {
		t.Errorf("the hub's server got %q, want the token once", got)
	}
	if got := fake.requests(); len(got) != 1 || got[0] != "" {
		t.Errorf("the other server got %q, want one request without a token", got)
	}
	_ = res
	res = Discover(context.Background(), Options{RuntimeDirs: []string{dir}, ServerToken: "hub-token"})
	if !strings.Contains(fmt.Sprint(res.Problems), "GPUMEM_SERVER_TOKEN_URLS names no server") {
		t.Errorf("problems %v, want the missing list said", res.Problems)
	}
	for _, r := range []*recorder{hub, fake} {
		for _, a := range r.requests()[1:] {
			if a != "" {
				t.Errorf("%s got %q without a list of servers for the token", r.URL, a)
			}
		}
	}
}
