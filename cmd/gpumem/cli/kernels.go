package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gpumem/gpumem/internal/safefile"
	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/discovery"
)

// kernelRow is one line of `gpumem kernels`; its JSON keys are a contract,
// and the daemon's GET /api/v1/kernels serves the same rows.
type kernelRow = api.KernelStatus

func runKernels(ctx context.Context, env Env, args []string) error {
	fs := newFlagSet(env, "kernels", "[--json] [--wide] [--runtime-dir DIR ...]")
	asJSON := fs.Bool("json", false, "print a JSON array")
	wide := fs.Bool("wide", false, "print kernel ids, paths and URLs whole (by default the table fits 100 columns)")
	var dirs dirList
	fs.Var(&dirs, "runtime-dir", "also scan this Jupyter runtime `dir` (repeatable; it must exist)")
	timeout := fs.Duration("timeout", time.Second, "how long to wait for each kernel's heartbeat")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos); err != nil {
		return err
	}
	if err := positive("timeout", *timeout); err != nil {
		return err
	}
	width := tableWidth
	if *wide {
		width = 0
	}
	if rows, ok := kernelsFromDaemon(ctx, env, dirs); ok {
		if *asJSON {
			return writeJSON(env.Stdout, rows)
		}
		return writeKernelTable(env.Stdout, rows, width)
	}
	res := discoverKernels(ctx, env, discovery.NewProcFinder(env.procFS()), dirs)
	for _, p := range res.Problems {
		fmt.Fprintf(env.Stderr, "gpumem: %s\n", textsafe.Line(p.Error()))
	}
	rows := make([]kernelRow, len(res.Kernels))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, k := range res.Kernels {
		rows[i] = kernelRow{KernelID: k.ID, Notebook: k.Notebook,
			ConnectionFile: k.ConnectionFile, ServerURL: k.ServerURL}
		if k.PIDProven {
			rows[i].PID = k.PID
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, *timeout)
			defer cancel()
			err := protocol.Ping(pctx, k.Connection)
			lang := kernelLanguage(env, k)
			if lang == "" && err == nil && k.ServerURL == "" {
				// ipykernel rewrites its file with kernel_name "" when started
				// bare (ipython kernel, jupyter kernel): ask the kernel itself.
				// No server runs it, so no idle culler counts this request.
				// A deadline of its own, not what is left of the heartbeat's:
				// the kernel answered that, and on a loaded host its shell's
				// reply takes longer than a heartbeat.
				lctx, cancel := context.WithTimeout(ctx, max(*timeout, languageTimeout))
				lang = askLanguage(lctx, k)
				cancel()
			}
			mu.Lock()
			defer mu.Unlock()
			rows[i].Alive = err == nil
			rows[i].Language = lang
			if err != nil {
				fmt.Fprintf(env.Stderr, "gpumem: kernel %s (%s) does not answer its heartbeat: %s\n", orDash(k.ID), orDash(k.ConnectionFile),
					textsafe.Line(err.Error()))
			}
		}()
	}
	wg.Wait()
	if *asJSON {
		return writeJSON(env.Stdout, rows)
	}
	return writeKernelTable(env.Stdout, rows, width)
}

// kernelsFromDaemon asks a running gpumem serve, which already follows every
// kernel of its runtime dirs; false when there is none, it refuses us, or
// we do not trust its socket (said in one line).
func kernelsFromDaemon(ctx context.Context, env Env, dirs []string) ([]kernelRow, bool) {
	if len(dirs) > 0 {
		return nil, false // the daemon watches its own dirs only
	}
	sock := daemonSocket(env, dirs)
	if sock == "" {
		return nil, false
	}
	c := api.NewClient(sock)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ks, err := c.Kernels(ctx)
	if err != nil {
		warnUntrusted(env, err) // then discovery, as without a daemon
		return nil, false
	}
	return ks, true
}

func discoverKernels(ctx context.Context, env Env, finder *discovery.ProcFinder, extraDirs []string) discovery.Result {
	token, urls, err := serverToken(env, nil)
	res := discovery.Discover(ctx, discovery.Options{
		RuntimeDirs:     discovery.RuntimeDirs(env.getenv, extraDirs),
		Procs:           finder,
		ServerToken:     token,
		ServerTokenURLs: urls,
	})
	if err != nil {
		res.Problems = append(res.Problems, err)
	}
	return res
}

// serverToken is GPUMEM_SERVER_TOKEN and the servers it is for: the URL
// patterns of GPUMEM_SERVER_TOKEN_URLS and of flags (serve's
// --server-token-url). A bad pattern is an error naming it; the token is
// then sent to none.
func serverToken(env Env, flags []string) (string, []discovery.TokenPattern, error) {
	token := env.getenv("GPUMEM_SERVER_TOKEN")
	urls, err := discovery.ParseTokenPatterns(env.getenv("GPUMEM_SERVER_TOKEN_URLS"))
	if err != nil {
		return "", nil, fmt.Errorf("GPUMEM_SERVER_TOKEN_URLS: %w", err)
	}
	for _, f := range flags {
		p, err := discovery.ParseTokenPattern(f)
		if err != nil {
			return "", nil, fmt.Errorf("--server-token-url: %w", err)
		}
		urls = append(urls, p)
	}
	return token, urls, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeKernelTable renders one row per kernel within width columns
// (the connection file, then the server, then the notebook cut in their
// middle, kernel ids shortened; 0: all whole).
func writeKernelTable(w io.Writer, rows []kernelRow, width int) error {
	tb := newTable("", "KERNEL", "NOTEBOOK", "PID", "LANGUAGE", "ALIVE", "CONNECTION FILE", "SERVER").cutMiddle(5, 6, 1)
	for _, r := range rows {
		pid := "-"
		if r.PID > 0 {
			pid = strconv.Itoa(r.PID)
		}
		alive := "no"
		if r.Alive {
			alive = "yes"
		}
		tb.add(kernelColumn(orDash(r.KernelID), width), orDash(r.Notebook), pid, orDash(r.Language), alive,
			orDash(r.ConnectionFile), orDash(r.ServerURL))
	}
	return tb.write(w, width)
}

// orDash shows s, which users or kernels may control (a notebook path, a
// kernel id, a user name, argv), in one line safe for a terminal
// (textsafe.Line), or "-" when it is empty. Every string of theirs goes
// through it (or textsafe itself) before a table or a message shows it.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return textsafe.Line(s)
}

// kernelLanguage reads the language from the kernel's kernelspec
// (<jupyter path>/kernels/<name>/kernel.json), without talking to the kernel:
// any request would count as activity for Jupyter's idle culler.
func kernelLanguage(env Env, k discovery.Kernel) string {
	if k.KernelName == "" {
		return ""
	}
	for _, dir := range kernelspecDirs(env) {
		data, _, err := safefile.Read(filepath.Join(dir, k.KernelName, "kernel.json"), 1<<20)
		if err != nil {
			continue
		}
		var spec struct {
			Language string `json:"language"`
		}
		if json.Unmarshal(data, &spec) == nil && spec.Language != "" {
			return spec.Language
		}
	}
	if k.KernelName == "python3" {
		// ipykernel's built-in spec, which jupyter_client serves without a
		// kernel.json on disk.
		return "python"
	}
	return ""
}

// languageTimeout bounds asking a kernel without a server for its
// language; the kernels are asked side by side.
const languageTimeout = 5 * time.Second

// askLanguage attaches to the kernel just long enough for its kernel_info.
func askLanguage(ctx context.Context, k discovery.Kernel) string {
	c, err := protocol.DialInfo(ctx, k.Connection, protocol.Options{ConnectTimeout: languageTimeout})
	if err != nil {
		return ""
	}
	defer c.Close()
	return c.LastKernelInfo().Language
}

// kernelspecDirs lists Jupyter's kernelspec search path, as jupyter_core does.
func kernelspecDirs(env Env) []string {
	var dirs []string
	for _, p := range filepath.SplitList(env.getenv("JUPYTER_PATH")) {
		if p != "" {
			dirs = append(dirs, filepath.Join(p, "kernels"))
		}
	}
	if d := env.getenv("JUPYTER_DATA_DIR"); d != "" {
		dirs = append(dirs, filepath.Join(d, "kernels"))
	} else if d := env.getenv("XDG_DATA_HOME"); d != "" {
		dirs = append(dirs, filepath.Join(d, "jupyter", "kernels"))
	} else if h := env.getenv("HOME"); h != "" {
		dirs = append(dirs, filepath.Join(h, ".local", "share", "jupyter", "kernels"))
	}
	return append(dirs, "/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels")
}
