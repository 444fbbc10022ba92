package magics_test

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpumem/gpumem/magics"
)

// TestSummaryWithSidecar: injected with gpumem serve's socket and the
// kernel id, %gpumem asks GET /api/v1/kernels/<id> on that socket (as a
// kernel caller may) and shows the driver's figure. The server here is a
// stand-in for the sidecar's API, serving the documented JSON.
func TestSummaryWithSidecar(t *testing.T) {
	s := newSession(t)
	// Unix socket paths are short (108 bytes): use a short dir.
	dir, err := os.MkdirTemp("", "gpm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var paths, hosts []string
	pid := s.k.Cmd.Process.Pid
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		hosts = append(hosts, r.Host)
		mu.Unlock()
		if r.Header.Get("Origin") != "" || r.Method != http.MethodGet {
			http.Error(w, `{"error":"refused"}`, http.StatusForbidden)
			return
		}
		if r.URL.Path != "/api/v1/kernels/"+s.k.ID {
			http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"kernel_id": s.k.ID, "notebook": "/home/u/leak.ipynb", "pids": []int{pid, pid + 1},
			"user": "u", "gpu_memory_bytes": 3 << 30,
			"per_gpu": []map[string]any{{"index": 0, "bytes": 2 << 30}, {"index": 1, "bytes": 1 << 30}},
		})
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	s.inject(magics.InjectOptions{SidecarSocket: sock, KernelID: s.k.ID})
	data, text := s.magic("%gpumem")
	want := "driver (NVML, via gpumem serve): 3.0 GiB for this kernel (GPU 0: 2.0 GiB, GPU 1: 1.0 GiB); pids "
	if !strings.Contains(text, want) {
		t.Errorf("%%gpumem with a sidecar lacks %q:\n%s\n%v", want, text, data)
	}
	mu.Lock()
	if len(paths) != 1 || paths[0] != "/api/v1/kernels/"+s.k.ID || hosts[0] != "local-gpumem.sock" {
		t.Errorf("requests: paths %v hosts %v", paths, hosts)
	}
	mu.Unlock()

	// The sidecar going away: the panel's sentence, no failure, no OSError.
	_ = srv.Close()
	_, text = s.magic("%gpumem")
	if !strings.Contains(text, "driver: gpumem serve is not running: nothing listens on "+sock+": ") ||
		!strings.Contains(text, "run `gpumem serve` beside JupyterLab") || strings.Contains(text, "Errno") {
		t.Errorf("%%gpumem with the sidecar gone:\n%s", text)
	}
}
