package api

import (
	"fmt"
	"unicode"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// SocketHost is the Host the Client sends: a name that resolves nowhere, so
// a request carrying it can only have come through the socket.
const SocketHost = "local-gpumem.sock"

// DefaultSocketName is the socket's file name in the Jupyter runtime dir.
const DefaultSocketName = "gpumem.sock"

// Mode is who may connect to the socket and what they may do; see the
// package documentation.
type Mode string

const (
	// ModePrivate: socket 0600, the daemon's user and root only.
	ModePrivate Mode = "private"
	// ModeShared: socket 0666; kernel processes may read and free their own kernel.
	ModeShared Mode = "shared"
)

// ParseMode parses the value of --socket-mode.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case ModePrivate, ModeShared:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown socket mode %q: use %q or %q", s, ModePrivate, ModeShared)
}

func (m Mode) perm() (uint32, error) {
	switch m {
	case ModePrivate:
		return 0o600, nil
	case ModeShared:
		return 0o666, nil
	}
	return 0, fmt.Errorf("unknown socket mode %q: use %q or %q", string(m), ModePrivate, ModeShared)
}

// FreeRequest is the optional body of POST /api/v1/kernels/{id}/free. The
// zero value (or no body) frees caches only: allocator caches are released
// and no variable is deleted.
type FreeRequest struct {
	// Vars are names of variables in the kernel's namespace to delete.
	Vars []string `json:"vars,omitempty"`
	// All deletes every variable that holds GPU memory.
	All bool `json:"all,omitempty"`
}

const (
	maxFreeVars    = 1024
	maxVarNameSize = 256
)

// Validate rejects requests the backend must never render into code: names
// that are not Python identifiers, and Vars together with All.
func (r FreeRequest) Validate() error {
	if r.All && len(r.Vars) > 0 {
		return fmt.Errorf("free request sets both vars and all: set one")
	}
	if len(r.Vars) > maxFreeVars {
		return fmt.Errorf("free request names %d variables, at most %d are allowed", len(r.Vars), maxFreeVars)
	}
	for _, v := range r.Vars {
		if !isIdentifier(v) {
			return fmt.Errorf("free request: %q is not a Python identifier", v)
		}
	}
	return nil
}

// isIdentifier reports whether s is a Python identifier (letters, digits and
// underscores, not starting with a digit). It is stricter than Python on
// some Unicode categories, never looser.
func isIdentifier(s string) bool {
	if s == "" || len(s) > maxVarNameSize {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_' || unicode.IsLetter(r):
		case i > 0 && unicode.IsDigit(r):
		default:
			return false
		}
	}
	return true
}

// KernelStatus is one kernel as the daemon follows it: the row of
// `gpumem kernels` (the same JSON keys).
type KernelStatus struct {
	KernelID       string `json:"kernel_id"`
	Notebook       string `json:"notebook"`
	PID            int    `json:"pid"`
	Language       string `json:"language"`
	Alive          bool   `json:"alive"`
	ConnectionFile string `json:"connection_file"`
	ServerURL      string `json:"server_url"`
}

// KernelsResponse is the reply of GET /api/v1/kernels.
type KernelsResponse struct {
	Kernels []KernelStatus `json:"kernels"`
}

// GPUsResponse is the reply of GET /api/v1/gpus.
type GPUsResponse struct {
	GPUs []attribution.GPU `json:"gpus"`
}

// UsersResponse is the reply of GET /api/v1/users.
type UsersResponse struct {
	Users []UserUsage `json:"users"`
}

// UserUsage is one user's GPU memory (attribution.Finish totals them).
type UserUsage = attribution.UserUsage
