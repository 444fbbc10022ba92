package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/gpumem/gpumem/internal/safefile"
)

// ConnectionInfo is a parsed, validated kernel connection file.
type ConnectionInfo struct {
	Path            string // file it was read from ("" when parsed from bytes)
	Transport       string // "tcp" or "ipc"
	IP              string
	ShellPort       int
	IOPubPort       int
	StdinPort       int // 0 when the file has none (gpumem never uses stdin)
	ControlPort     int
	HBPort          int
	Key             string // HMAC key as UTF-8 bytes; "" = unsigned
	SignatureScheme string // "hmac-sha256"
	KernelName      string // optional
}

// ErrCurveNotSupported is returned for connection files that carry curve_*
// keys: zmq4 speaks only the NULL and PLAIN ZeroMQ security mechanisms.
var ErrCurveNotSupported = errors.New("CURVE encryption is not supported")

// ConnectionFileError is what ReadConnectionFile and ParseConnectionInfo
// return for a file they cannot use. It names the file.
type ConnectionFileError struct {
	Path string // "" when parsed from bytes
	Err  error
}

func (e *ConnectionFileError) Error() string {
	if e.Path == "" {
		return "kernel connection info: " + e.Err.Error()
	}
	return "kernel connection file " + e.Path + ": " + e.Err.Error()
}

func (e *ConnectionFileError) Unwrap() error { return e.Err }

// maxConnectionFileBytes bounds what we read: real files are about 300 bytes.
const maxConnectionFileBytes = 1 << 20

// ReadConnectionFile reads and validates a kernel connection file
// (kernel-<id>.json). A relative ipc path is resolved against the file's
// directory. Only a regular file is read (a FIFO named like one would block
// the reader forever), and at most maxConnectionFileBytes of it.
func ReadConnectionFile(path string) (ConnectionInfo, error) {
	info, _, err := ReadConnectionFileStat(path)
	return info, err
}

// ReadConnectionFileBytes reads a connection file as ReadConnectionFile
// does (a regular file, not through a link, at most
// maxConnectionFileBytes), without parsing it, with its owner and identity
// and its stamp (a reader that keeps what it parsed asks the stamp whether
// the file changed).
func ReadConnectionFileBytes(path string) ([]byte, safefile.Info, safefile.Stamp, error) {
	data, st, stamp, err := safefile.ReadStamped(path, maxConnectionFileBytes)
	if err != nil {
		return nil, st, stamp, &ConnectionFileError{Path: path, Err: err}
	}
	return data, st, stamp, nil
}

// ReadConnectionFileStat is ReadConnectionFile that also returns the file's
// owner and identity as read: a connection file proves nothing by itself,
// and the process serving it must belong to the same user and name it.
func ReadConnectionFileStat(path string) (ConnectionInfo, safefile.Info, error) {
	data, st, _, err := ReadConnectionFileBytes(path)
	if err != nil {
		return ConnectionInfo{}, st, err
	}
	info, err := ParseConnectionFile(data, path)
	return info, st, err
}

// ParseConnectionFile is ReadConnectionFile of bytes already read from
// path (a relative ipc path is resolved against its directory).
func ParseConnectionFile(data []byte, path string) (ConnectionInfo, error) {
	info, err := parseConnectionInfo(data, path)
	if err != nil {
		return ConnectionInfo{}, &ConnectionFileError{Path: path, Err: err}
	}
	return info, nil
}

// ParseConnectionInfo parses and validates the contents of a connection file.
func ParseConnectionInfo(data []byte) (ConnectionInfo, error) {
	info, err := parseConnectionInfo(data, "")
	if err != nil {
		return ConnectionInfo{}, &ConnectionFileError{Err: err}
	}
	return info, nil
}

const regenerateHint = "the file is damaged or not a Jupyter kernel connection file; restart the kernel to rewrite it"

// hostnameRE accepts DNS names; IP literals are checked with net.ParseIP.
// Compiled on first use: most connection files name an IP literal.
var hostnameRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?$`)
})

func parseConnectionInfo(data []byte, path string) (ConnectionInfo, error) {
	if len(data) > maxConnectionFileBytes {
		return ConnectionInfo{}, fmt.Errorf("larger than %d bytes: %s", maxConnectionFileBytes, regenerateHint)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return ConnectionInfo{}, fmt.Errorf("empty: %s", regenerateHint)
	}
	if trimmed[0] != '{' {
		return ConnectionInfo{}, fmt.Errorf("not a JSON object: %s", regenerateHint)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &fields); err != nil {
		return ConnectionInfo{}, fmt.Errorf("invalid JSON: %w: %s", err, regenerateHint)
	}

	var curve []string
	for name := range fields {
		if strings.HasPrefix(strings.ToLower(name), "curve_") {
			curve = append(curve, name)
		}
	}
	if len(curve) > 0 {
		sort.Strings(curve)
		return ConnectionInfo{}, fmt.Errorf("%w (the file has %s): gpumem can attach only to kernels started without CURVE keys",
			ErrCurveNotSupported, strings.Join(curve, ", "))
	}

	info := ConnectionInfo{Path: path}
	if err := parseAddress(fields, &info); err != nil {
		return ConnectionInfo{}, err
	}
	if err := parsePorts(fields, &info); err != nil {
		return ConnectionInfo{}, err
	}
	return info, nil
}

// parseAddress reads the file's transport, signature scheme, key, kernel
// name and ip into info (path set): each checked, the ipc path prefix made
// absolute beside the file.
func parseAddress(fields map[string]json.RawMessage, info *ConnectionInfo) error {
	var err error
	if info.Transport, err = optionalString(fields, "transport", "tcp"); err != nil {
		return err
	}
	if info.Transport != "tcp" && info.Transport != "ipc" {
		return fmt.Errorf("transport %q is not supported: want \"tcp\" or \"ipc\"", info.Transport)
	}
	if info.SignatureScheme, err = optionalString(fields, "signature_scheme", "hmac-sha256"); err != nil {
		return err
	}
	if info.SignatureScheme != "hmac-sha256" {
		return fmt.Errorf("signature_scheme %q is not supported: gpumem signs messages with hmac-sha256 only (Jupyter's default); start the kernel with the default signature scheme", info.SignatureScheme)
	}
	if info.Key, err = optionalString(fields, "key", ""); err != nil {
		return err
	}
	if info.KernelName, err = optionalString(fields, "kernel_name", ""); err != nil {
		return err
	}
	if info.IP, err = optionalString(fields, "ip", ""); err != nil {
		return err
	}
	switch info.Transport {
	case "tcp":
		if info.IP == "" {
			return fmt.Errorf("ip is missing: %s", regenerateHint)
		}
		if info.IP != "*" && net.ParseIP(info.IP) == nil && !hostnameRE().MatchString(info.IP) {
			return fmt.Errorf("ip %q is neither an IP address nor a host name: %s", info.IP, regenerateHint)
		}
	case "ipc":
		if info.IP == "" {
			return fmt.Errorf("ip (the ipc socket path prefix) is missing: %s", regenerateHint)
		}
		if strings.ContainsRune(info.IP, 0) {
			return fmt.Errorf("ip (the ipc socket path prefix) contains a NUL byte: %s", regenerateHint)
		}
		if !filepath.IsAbs(info.IP) && info.Path != "" {
			info.IP = filepath.Join(filepath.Dir(info.Path), info.IP)
		}
	}
	return nil
}

// parsePorts reads the five ports into info, whose transport is known.
func parsePorts(fields map[string]json.RawMessage, info *ConnectionInfo) error {
	maxPort := 65535
	if info.Transport == "ipc" {
		maxPort = 1<<31 - 1 // ipc "ports" are socket path suffixes
	}
	for _, p := range []struct {
		name     string
		dst      *int
		required bool
	}{
		{"shell_port", &info.ShellPort, true},
		{"iopub_port", &info.IOPubPort, true},
		{"stdin_port", &info.StdinPort, false},
		{"control_port", &info.ControlPort, true},
		{"hb_port", &info.HBPort, true},
	} {
		raw, ok := fields[p.name]
		if !ok {
			if p.required {
				return fmt.Errorf("%s is missing: %s", p.name, regenerateHint)
			}
			continue
		}
		port, err := parsePort(raw, maxPort)
		if err != nil {
			return fmt.Errorf("%s: %w: %s", p.name, err, regenerateHint)
		}
		*p.dst = port
	}
	return nil
}

func optionalString(fields map[string]json.RawMessage, name, def string) (string, error) {
	raw, ok := fields[name]
	if !ok || string(raw) == "null" {
		return def, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: want a string, got %s: %s", name, clip(raw, 40), regenerateHint)
	}
	return s, nil
}

func parsePort(raw json.RawMessage, maxPort int) (int, error) {
	s := string(bytes.TrimSpace(raw))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("want an integer port, got %s", clip(raw, 40))
	}
	if n < 1 || n > int64(maxPort) {
		return 0, fmt.Errorf("port %d out of range 1..%d", n, maxPort)
	}
	return int(n), nil
}

// clip quotes at most n bytes of b for an error message.
func clip(b []byte, n int) string {
	if len(b) > n {
		return strconv.Quote(string(b[:n])) + "…"
	}
	return strconv.Quote(string(b))
}

// address is the network and address of one of the kernel's sockets, as
// net.Dial takes them.
func (ci ConnectionInfo) address(port int) (network, addr string) {
	if ci.Transport == "ipc" {
		return "unix", ci.IP + "-" + strconv.Itoa(port)
	}
	return "tcp", net.JoinHostPort(connectHost(ci.IP), strconv.Itoa(port))
}

// endpoint returns the zmq4 endpoint of one of the kernel's sockets, on
// gpumem's guarded transports (see transport.go).
func (ci ConnectionInfo) endpoint(port int) string {
	if ci.Transport == "ipc" {
		return transportIPC + "://" + ci.IP + "-" + strconv.Itoa(port)
	}
	return transportTCP + "://" + net.JoinHostPort(connectHost(ci.IP), strconv.Itoa(port))
}

// connectHost maps the wildcard addresses a kernel may bind to onto the
// loopback address a client can connect to (as jupyter_client does).
func connectHost(ip string) string {
	switch ip {
	case "", "*", "0.0.0.0":
		return "127.0.0.1"
	case "::":
		return "::1"
	}
	return ip
}
