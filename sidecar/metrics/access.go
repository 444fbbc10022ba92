package metrics

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Loopback is no boundary between the users of one host: any of them can
// connect to 127.0.0.1:9464. On a shared host (a shared socket, or
// --all-users) per-notebook series would show every user the notebook
// paths and kernel ids of all the others, which the socket shows each user
// for their own kernels only. There, a scrape gets them only with a bearer
// token (Prometheus's authorization.credentials_file) that the admin keeps
// in a file only the daemon's user can read; a scrape without it gets the
// series that name users and GPUs only, as with PerNotebook(false), which
// the alert rules fall back to.

// NotebooksOnlyWith makes the per-notebook series (those labelled by
// kernel_id and notebook) the privilege of scrapes that send
// "Authorization: Bearer <token>". Scrapes without an Authorization header
// get every other series; a wrong token gets 401. Call it before Handler.
func (m *Metrics) NotebooksOnlyWith(token string) {
	pub := prometheus.NewRegistry()
	pub.MustRegister(
		snapshotCollector{src: m.src, perNotebook: false},
		podCollector{src: m.src, perNotebook: false},
		computeCollector{src: m.src, perNotebook: false},
		m.reclaimedBytes,
		m.reclaimedProcs,
		m.culled,
		m.oom.byUser,
		m.leftRunning,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.public, m.token = pub, token
}

// scrapeHandler serves a scrape from the registry its credentials allow.
func (m *Metrics) scrapeHandler(opts promhttp.HandlerOpts) http.Handler {
	full := promhttp.HandlerFor(m.reg, opts)
	if m.public == nil {
		return full
	}
	public := promhttp.HandlerFor(m.public, opts)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch bearerMatches(r.Header.Values("Authorization"), m.token) {
		case bearerAbsent:
			public.ServeHTTP(w, r)
		case bearerRight:
			full.ServeHTTP(w, r)
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="gpumem"`)
			http.Error(w, "wrong metrics token: per-notebook series need the token of --metrics-token-file", http.StatusUnauthorized)
		}
	})
}

type bearer int

const (
	bearerAbsent bearer = iota
	bearerRight
	bearerWrong
)

// bearerMatches says whether the Authorization headers carry token.
func bearerMatches(headers []string, token string) bearer {
	if len(headers) == 0 {
		return bearerAbsent
	}
	if len(headers) != 1 || token == "" {
		return bearerWrong
	}
	scheme, cred, ok := strings.Cut(headers[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return bearerWrong
	}
	if subtle.ConstantTimeCompare([]byte(strings.TrimSpace(cred)), []byte(token)) != 1 {
		return bearerWrong
	}
	return bearerRight
}

// minTokenLen keeps a guessable token out.
const minTokenLen = 16

// ReadTokenFile reads the metrics token: a regular file of the daemon's
// own user that no one else may read or write (the token is what stands
// between local users and each other's notebook paths), holding at least
// 16 characters on one line.
func ReadTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("metrics token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("metrics token file: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("metrics token file %s: not a regular file", path)
	case !ok || st.Uid != uint32(os.Geteuid()):
		return "", fmt.Errorf("metrics token file %s: must belong to the daemon's user (uid %d)", path, os.Geteuid())
	case fi.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("metrics token file %s: mode %#o lets others read or change it: chmod 600 it", path, fi.Mode().Perm())
	case fi.Size() > 4096:
		return "", fmt.Errorf("metrics token file %s: %d bytes, want one line", path, fi.Size())
	}
	data, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("metrics token file %s: %w", path, err)
	}
	token := strings.TrimSpace(string(data))
	if strings.ContainsAny(token, " \t\r\n") {
		return "", fmt.Errorf("metrics token file %s: want the token alone on one line", path)
	}
	if len(token) < minTokenLen {
		return "", errors.New("metrics token file " + path + ": the token is shorter than 16 characters: use e.g. `openssl rand -hex 32`")
	}
	return token, nil
}
