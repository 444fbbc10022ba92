package adversarial

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestMetricsShowNoOtherUsersNotebooks: /metrics on loopback is open to
// every local user. On a shared host it names no notebook and no kernel id
// (what bob may not see of alice's through the socket) to a scrape without
// the admin's token, yet keeps the per-user and GPU series the alert rules
// fall back to; with --metrics-token-file, a scrape bearing the token (and
// only that) gets the per-notebook series.
func TestMetricsShowNoOtherUsersNotebooks(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel")
	alice, bob := testenv.MakeUser(t, "ma"), testenv.MakeUser(t, "mb")
	id := testenv.RandomHex(8) + "-m"
	secret := filepath.Join(alice.Home, "secret-project", "plan.ipynb")
	aliceFile := filepath.Join(alice.RuntimeDir(), "kernel-"+id+".json")
	ak := alice.StartKernel(t, aliceFile, "JPY_SESSION_NAME="+secret)
	testenv.WaitKernelListening(t, aliceFile, 60*time.Second)
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: ak.Cmd.Process.Pid, UsedBytes: 3 << 30})

	start := func(t *testing.T, args ...string) (*testenv.Daemon, string) {
		d, _ := sharedDaemon(t, gpu, []testenv.User{alice, bob}, append([]string{"--listen=127.0.0.1:0"}, args...)...)
		addr := fmt.Sprint(d.WaitLog(t, 30*time.Second, "serving metrics", nil)["addr"])
		testenv.Poll(t, 30*time.Second, "alice's kernel in the report", func() bool {
			for _, nb := range d.Report(t).Notebooks {
				if nb.KernelID == id && len(nb.PIDs) > 0 && nb.Notebook == secret {
					return true
				}
			}
			return false
		})
		return d, "http://" + addr + "/metrics"
	}
	scrape := func(t *testing.T, u testenv.User, url string, header ...string) (string, string) {
		argv := []string{"curl", "-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}"}
		for _, h := range header {
			argv = append(argv, "-H", h)
		}
		out, stderr, err := u.Run(nil, append(argv, url)...)
		if err != nil {
			t.Fatalf("curl %s as %s: %v: %s", url, u.Name, err, stderr)
		}
		i := strings.LastIndexByte(out, '\n')
		return out[i+1:], out[:i]
	}
	var cu crossUser
	defer cu.summary(t)
	leaks := func(body string) bool {
		return strings.Contains(body, id) || strings.Contains(body, "plan.ipynb") || strings.Contains(body, "secret-project")
	}
	keeps := func(t *testing.T, body string) {
		t.Helper()
		for _, want := range []string{`gpumem_user_gpu_memory_bytes{gpu="0",user="` + alice.Name + `"} 3.221225472e+09`, "gpumem_sample_success 1", "gpumem_gpu_memory_used_bytes{"} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
	}

	t.Run("no token", func(t *testing.T) {
		d, url := start(t)
		for i := 0; i < 3; i++ {
			status, body := scrape(t, bob, url)
			cu.read(t, leaks(body), fmt.Sprintf("bob's scrape of %s (%s) names alice's notebook or kernel", url, status))
			keeps(t, body)
		}
		d.Stop(syscall.SIGTERM)
	})

	t.Run("with the admin's token", func(t *testing.T) {
		dir, err := os.MkdirTemp("", "gpumem-token-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		token := testenv.RandomHex(24)
		tokenFile := filepath.Join(dir, "metrics.token")
		if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := bob.Run(nil, "cat", tokenFile); err == nil {
			t.Fatal("bob can read the token file")
		}
		_, url := start(t, "--metrics-token-file="+tokenFile)
		status, body := scrape(t, bob, url)
		cu.read(t, leaks(body), fmt.Sprintf("bob's scrape without the token (%s) names alice's notebook or kernel", status))
		keeps(t, body)
		status, body = scrape(t, bob, url, "Authorization: Bearer not-the-token-"+testenv.RandomHex(8))
		cu.read(t, leaks(body) || status != "401", fmt.Sprintf("bob's scrape with a wrong token: %s", status))
		root := testenv.User{Name: "root", Home: "/root"}
		status, body = scrape(t, root, url, "Authorization: Bearer "+token)
		if status != "200" || !strings.Contains(body, `kernel_id="`+id+`"`) || !strings.Contains(body, `notebook="`+secret+`"`) {
			t.Errorf("a scrape with the token: %s, want alice's series with her kernel id and notebook:\n%.2000s", status, body)
		}
	})
}
