package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Server is a running Jupyter server, from its jpserver-/nbserver- file.
type Server struct {
	File    string `json:"-"`        // the info file it was read from
	Kind    string `json:"-"`        // "jupyter_server" or "notebook"
	URL     string `json:"url"`      // base URL, with trailing slash
	Token   string `json:"token"`    // never logged
	RootDir string `json:"root_dir"` // notebook_dir on Notebook 6
	PID     int    `json:"pid"`
	Version string `json:"version"`
	// Password is true when the server asks for a password: its file then
	// holds no token, and without GPUMEM_SERVER_TOKEN it is not asked.
	Password bool `json:"-"`
	// TokenGiven is true when Token came from GPUMEM_SERVER_TOKEN, not from the server's file.
	TokenGiven bool `json:"-"`
	// FileUID owns the info file: the server is asked only through a
	// listener of this uid (see requestTarget), and names only kernels
	// whose connection files are this uid's, in the file's own dir.
	FileUID uint32 `json:"-"`
	// listeners says who listens on TCP addresses (nil: /proc).
	listeners ListenerFinder
	// netns, for a server inside a pod, dials from inside the pod's network
	// namespace; its listeners are the pod's. nil: this host's.
	netns *podNet
}

// parseServerFile parses a jpserver-<pid>.json or nbserver-<pid>.json file.
func parseServerFile(name string, data []byte) (Server, error) {
	var raw struct {
		URL         string `json:"url"`
		Token       string `json:"token"`
		RootDir     string `json:"root_dir"`
		NotebookDir string `json:"notebook_dir"`
		PID         int    `json:"pid"`
		Version     string `json:"version"`
		BaseURL     string `json:"base_url"`
		Password    bool   `json:"password"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Server{}, fmt.Errorf("server file %s: not valid JSON (%v)", name, err)
	}
	if raw.URL == "" {
		return Server{}, fmt.Errorf("server file %s: no \"url\"", name)
	}
	s := Server{File: name, URL: raw.URL, Token: raw.Token, RootDir: raw.RootDir, PID: raw.PID, Version: raw.Version,
		Password: raw.Password}
	s.Kind = "jupyter_server"
	if strings.HasPrefix(filepath.Base(name), "nbserver-") {
		s.Kind = "notebook"
	}
	if s.RootDir == "" {
		s.RootDir = raw.NotebookDir
	}
	if !strings.HasSuffix(s.URL, "/") {
		s.URL += "/"
	}
	return s, nil
}

// serverFilePID is the pid a server file's name gives (jpserver-<pid>.json),
// or 0.
func serverFilePID(path string) int {
	name := strings.TrimSuffix(filepath.Base(path), ".json")
	for _, prefix := range []string{"jpserver-", "nbserver-"} {
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			if pid, err := strconv.Atoi(rest); err == nil && pid > 0 {
				return pid
			}
		}
	}
	return 0
}

// readServerFile reads and parses a server file. jupyter_server writes
// its file in place, so a read during that write sees it cut short: a file
// that does not parse is read once more, a moment later, before it counts
// as broken.
func readServerFile(ctx context.Context, path string, read func(string) ([]byte, error), again time.Duration) (Server, error) {
	data, err := read(path)
	if err != nil {
		return Server{}, fmt.Errorf("server file: %w", err)
	}
	s, err := parseServerFile(path, data)
	if err == nil {
		return s, nil
	}
	select {
	case <-ctx.Done():
		return Server{}, err
	case <-time.After(again):
	}
	data, rerr := read(path)
	if rerr != nil {
		return Server{}, err
	}
	return parseServerFile(path, data)
}

// ProcessChecker tells whether a process lives. The ProcFinder implements
// it; discovery uses it to advise deleting a server's file only when the
// server's process is gone.
type ProcessChecker interface {
	Alive(pid int) bool
}

// fileAdvice ends a problem with a server file: delete it only when its
// server's process is gone; never for a live one (a server still writing
// its file, or not answering yet); nothing when it cannot be told.
func fileAdvice(err error, pid int, pc ProcessChecker) error {
	if pid <= 0 || pc == nil {
		return err
	}
	if pc.Alive(pid) {
		return fmt.Errorf("%w; its server (pid %d) is running: leave the file, it is read again at the next scan", err, pid)
	}
	return fmt.Errorf("%w; its server (pid %d) is gone: delete the file", err, pid)
}

// serverFiles lists the server info files in dir.
func serverFiles(dir string) ([]string, error) {
	var out []string
	for _, pattern := range []string{"jpserver-*.json", "nbserver-*.json"} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}

// Session is one entry of a server's GET /api/sessions.
type Session struct {
	ID     string `json:"id"`
	Path   string `json:"path"`
	Name   string `json:"name"`
	Type   string `json:"type"`
	Kernel struct {
		ID             string `json:"id"`
		Name           string `json:"name"`
		LastActivity   string `json:"last_activity"`
		ExecutionState string `json:"execution_state"`
		Connections    int    `json:"connections"`
	} `json:"kernel"`
}

// Sessions fetches GET /api/sessions from s with its token, over TCP or
// the unix socket its URL names. A server that asks for a password and for
// which no token was given is not asked: ErrNoToken says what to do.
func (s Server) Sessions(ctx context.Context, hc *http.Client) ([]Session, error) {
	// no_track_activity: jupyter_server would otherwise count the poll as
	// the user's activity, and JupyterHub's idle culler would never stop
	// the server (Notebook 6 ignores it).
	body, err := s.get(ctx, hc, "api/sessions", "?no_track_activity=1")
	if err != nil {
		return nil, err
	}
	var sessions []Session
	if err := json.Unmarshal(body, &sessions); err != nil {
		return nil, fmt.Errorf("server %s (%s): /api/sessions is not a session list: %w", s.URL, s.File, err)
	}
	return sessions, nil
}

// LastActivity is the server's own last activity, from GET /api/status
// (which jupyter_server does not count as activity): the newest of its
// kernels' messages and its users' requests.
func (s Server) LastActivity(ctx context.Context, hc *http.Client) (time.Time, error) {
	body, err := s.get(ctx, hc, "api/status", "")
	if err != nil {
		return time.Time{}, err
	}
	var st struct {
		LastActivity string `json:"last_activity"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return time.Time{}, fmt.Errorf("server %s (%s): /api/status is not a status: %w", s.URL, s.File, err)
	}
	at, err := time.Parse(time.RFC3339Nano, st.LastActivity)
	if err != nil {
		return time.Time{}, fmt.Errorf("server %s (%s): /api/status's last_activity %q: %w", s.URL, s.File, st.LastActivity, err)
	}
	return at, nil
}

// get fetches GET /<path><query> from s with its token (16 MiB at most),
// and says which server and what to do when it cannot.
func (s Server) get(ctx context.Context, hc *http.Client, path, query string) ([]byte, error) {
	if s.Token == "" && s.Password {
		return nil, s.noTokenError()
	}
	target, hc, err := s.requestTarget(hc)
	if err != nil {
		return nil, fmt.Errorf("server %s (%s): %w", s.URL, s.File, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target+path+query, nil)
	if err != nil {
		return nil, fmt.Errorf("server %s (%s): %w", s.URL, s.File, err)
	}
	if s.Token != "" {
		req.Header.Set("Authorization", "token "+s.Token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, s.requestError(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("server %s (%s): reading /%s: %w", s.URL, s.File, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		switch {
		case s.Token == "" && (resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized):
			return nil, s.noTokenError()
		case s.TokenGiven:
			return nil, fmt.Errorf("server %s (%s): GET /%s: %s with the token from GPUMEM_SERVER_TOKEN", s.URL, s.File, path, resp.Status)
		}
		return nil, fmt.Errorf("server %s (%s): GET /%s: %s (is the token in its file current?)", s.URL, s.File, path, resp.Status)
	}
	return body, nil
}

// NotebookPath makes a session path (relative to the server's root, always
// with forward slashes) absolute.
func (s Server) notebookPath(sessionPath string) string {
	if sessionPath == "" {
		return ""
	}
	clean := path.Clean("/" + sessionPath)[1:]
	root := s.RootDir
	if strings.HasPrefix(root, "~") {
		if h, err := os.UserHomeDir(); err == nil {
			root = filepath.Join(h, root[1:])
		}
	}
	if root == "" {
		return filepath.FromSlash(clean)
	}
	return filepath.Join(root, filepath.FromSlash(clean))
}
