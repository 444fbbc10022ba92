package magics

// The boot plumbing every request shares: the embedded package and its
// bundle, the kernel check, and the one silent execute of bootstrap.py
// that carries an action and reads its report back.

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/gpumem/gpumem/protocol"
)

// The package injected into kernels, one module per job (see its
// __init__.py), and the bootstrap that installs it from memory.
//
//go:embed py/gpumem_magics/*.py
var packageFS embed.FS

//go:embed py/bootstrap.py
var bootstrapSource string

// sources is the injected package's modules: name (without .py) ->
// Python source.
var sources = sync.OnceValue(func() map[string]string {
	const dir = "py/gpumem_magics"
	entries, err := fs.ReadDir(packageFS, dir)
	if err != nil {
		panic(err) // embedded at build time: cannot fail
	}
	m := make(map[string]string, len(entries))
	for _, e := range entries {
		b, err := fs.ReadFile(packageFS, path.Join(dir, e.Name()))
		if err != nil {
			panic(err)
		}
		m[strings.TrimSuffix(e.Name(), ".py")] = string(b)
	}
	return m
})

// bundleJSON is the package as the bootstrap reads it: a JSON object of
// module name -> source (encoding/json sorts the keys, so it is stable).
var bundleJSON = sync.OnceValue(func() []byte {
	b, err := json.Marshal(sources())
	if err != nil {
		panic(err) // strings always marshal
	}
	return b
})

// Version identifies the embedded package: the first 12 hex digits of the
// SHA-256 of its bundle. The kernel's package reports it; FreeCache reuses
// an injected package only when its version matches.
func Version() string { return sourceVersion() }

// Computed on first use, not at start-up: every gpumem command links this
// package, few inject.
var sourceVersion = sync.OnceValue(func() string {
	sum := sha256.Sum256(bundleJSON())
	return hex.EncodeToString(sum[:6])
})

// compressedBundle is the bundle as zlib+base64, which is what travels: a
// third of the size, and ipykernel hashes every cell's text in pure Python.
var compressedBundle = sync.OnceValue(func() string { return compress(bundleJSON()) })

func compress(b []byte) string {
	var out bytes.Buffer
	w, err := zlib.NewWriterLevel(&out, zlib.BestCompression)
	if err != nil {
		panic(err) // only for an invalid level
	}
	if _, err := w.Write(b); err != nil {
		panic(err) // a bytes.Buffer does not fail
	}
	if err := w.Close(); err != nil {
		panic(err)
	}
	return base64.StdEncoding.EncodeToString(out.Bytes())
}

// Executor is what magics needs of a kernel connection; *protocol.Client
// satisfies it. Execute must send an execute_request on the shell channel
// and return its reply with the user_expressions decoded.
type Executor interface {
	Execute(ctx context.Context, code string, opts protocol.ExecuteOptions) (protocol.ExecuteReply, error)
	KernelInfo(ctx context.Context) (protocol.KernelInfo, error)
}

// ErrUnsupportedKernel is wrapped by the errors Inject and FreeCache return
// for a kernel they cannot serve (not Python 3, not IPython). Nothing was
// run in such a kernel beyond kernel_info (and, for a Python kernel without
// IPython, the bootstrap's check).
var ErrUnsupportedKernel = errors.New("unsupported kernel")

// bootReport is what bootstrap.py returns through the user expression.
type bootReport struct {
	Kind             string          `json:"kind"`
	Nonce            string          `json:"nonce"`
	OK               bool            `json:"ok"`
	Error            string          `json:"error"`
	Replaced         bool            `json:"replaced"`
	Version          string          `json:"version"`
	Python           string          `json:"python"`
	IPython          string          `json:"ipython"`
	LoadedBefore     bool            `json:"loaded_before"`
	FrameworksLoaded []string        `json:"frameworks_loaded"`
	Result           json.RawMessage `json:"result"`
}

// unsupportedKernel: the bootstrap found no IPython shell to serve (a
// plain Python kernel).
func (r bootReport) unsupportedKernel() bool { return strings.Contains(r.Error, "no IPython shell") }

// runAction runs one of the bootstrap's actions on a request and returns
// its result.
func runAction(ctx context.Context, ex Executor, action string, request any) (json.RawMessage, error) {
	rep, err := runBoot(ctx, ex, action, map[string]any{"version": Version()}, request)
	if err != nil {
		return nil, err
	}
	if !rep.OK {
		if rep.unsupportedKernel() {
			return nil, fmt.Errorf("%s: %s: %w", action, rep.Error, ErrUnsupportedKernel)
		}
		return nil, fmt.Errorf("%s: failed in the kernel: %s", action, rep.Error)
	}
	return rep.Result, nil
}

// checkKernel fills res from kernel_info and refuses non-Python-3 kernels.
func checkKernel(ctx context.Context, ex Executor, res *InjectResult) error {
	ki, err := ex.KernelInfo(ctx)
	if err != nil {
		return fmt.Errorf("kernel_info: %w", err)
	}
	res.Implementation, res.Language, res.LanguageVersion = ki.Implementation, ki.Language, ki.LanguageVersion
	if !strings.EqualFold(ki.Language, "python") {
		res.Reason = fmt.Sprintf("the kernel's language is %q (implementation %q): the %%gpumem magics need an IPython kernel", ki.Language, ki.Implementation)
		return fmt.Errorf("%s: %w", res.Reason, ErrUnsupportedKernel)
	}
	if major, minor, ok := pyVersion(ki.LanguageVersion); ok && (major < 3 || major == 3 && minor < 7) {
		res.Reason = fmt.Sprintf("the kernel runs Python %s: the %%gpumem magics need Python 3.7 or later", ki.LanguageVersion)
		return fmt.Errorf("%s: %w", res.Reason, ErrUnsupportedKernel)
	}
	return nil
}

// requirePython is checkKernel for a caller that needs only its verdict.
func requirePython(ctx context.Context, ex Executor) error {
	var ignored InjectResult
	return checkKernel(ctx, ex, &ignored)
}

func pyVersion(v string) (major, minor int, ok bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return ma, mi, true
}

// runBoot sends the bootstrap with one action and decodes its report.
func runBoot(ctx context.Context, ex Executor, action string, cfg map[string]any, request any) (bootReport, error) {
	code, expr, nonce, err := bootCode(action, cfg, request)
	if err != nil {
		return bootReport{}, err
	}
	reply, err := ex.Execute(ctx, code, protocol.ExecuteOptions{UserExpressions: map[string]string{"gpumem": expr}})
	if err != nil {
		return bootReport{}, fmt.Errorf("%s: execute: %w", action, err)
	}
	if reply.Status != "ok" {
		return bootReport{}, fmt.Errorf("%s: the kernel answered %s: %s: %s", action, reply.Status, reply.EName, reply.EValue)
	}
	ur, ok := reply.UserExpressions["gpumem"]
	if !ok {
		return bootReport{}, fmt.Errorf("%s: the kernel's reply has no user_expressions result", action)
	}
	if ur.Status != "ok" {
		return bootReport{}, fmt.Errorf("%s: reading the result failed in the kernel: %s: %s", action, ur.EName, ur.EValue)
	}
	raw, ok := ur.Data["application/json"]
	if !ok {
		plain := string(ur.Data["text/plain"])
		return bootReport{}, fmt.Errorf("%s: the kernel gave no report (got %s): is it an IPython kernel?", action, plain)
	}
	var rep bootReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		return bootReport{}, fmt.Errorf("%s: decode the kernel's report: %w", action, err)
	}
	if rep.Nonce != nonce {
		return bootReport{}, fmt.Errorf("%s: the kernel's report is for another request (nonce %q, want %q)", action, rep.Nonce, nonce)
	}
	return rep, nil
}

// bootCode builds the silent cell that execs bootstrap.py in a private
// globals dict, and the user expression that fetches (and removes) its
// report. The first line is a marker by which the package's hygiene module
// finds this cell in linecache, to remove it.
func bootCode(action string, cfg map[string]any, request any) (code, expr, nonce string, err error) {
	return bootCodeFor(compressedBundle(), action, cfg, request)
}

// bootCodeFor is bootCode with the bundle given (compressed), for tests
// that inject a broken package.
func bootCodeFor(bundle, action string, cfg map[string]any, request any) (code, expr, nonce string, err error) {
	var nb [16]byte
	if _, err := rand.Read(nb[:]); err != nil {
		return "", "", "", fmt.Errorf("nonce: %w", err)
	}
	nonce = hex.EncodeToString(nb[:])
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return "", "", "", fmt.Errorf("config: %w", err)
	}
	if request == nil {
		request = map[string]any{}
	}
	reqJSON, err := json.Marshal(request)
	if err != nil {
		return "", "", "", fmt.Errorf("%s request: %w", action, err)
	}
	var b strings.Builder
	b.WriteString("# gpumem-inject ")
	b.WriteString(nonce)
	b.WriteString("\n__import__(\"builtins\").exec(")
	b.WriteString(pyStr(bootstrapSource))
	b.WriteString(", {\"__builtins__\": __import__(\"builtins\"), \"__name__\": \"_gpumem_bootstrap\", \"_ARGS\": {\"nonce\": ")
	b.WriteString(pyStr(nonce))
	b.WriteString(", \"action\": ")
	b.WriteString(pyStr(action))
	b.WriteString(", \"bundle\": ")
	b.WriteString(pyStr(bundle))
	b.WriteString(", \"config\": ")
	b.WriteString(pyStr(string(cfgJSON)))
	b.WriteString(", \"request\": ")
	b.WriteString(pyStr(string(reqJSON)))
	b.WriteString("}})")
	expr = fmt.Sprintf("__import__(\"sys\").modules.pop(\"_gpumem_report_%s\", None)", nonce)
	return b.String(), expr, nonce, nil
}

// pyStr returns s as a Python string literal: a JSON string is one (every
// JSON escape is a Python escape), and it never contains a raw newline.
func pyStr(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err) // a string always encodes
	}
	return strings.TrimSuffix(b.String(), "\n")
}
