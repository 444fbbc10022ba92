package testenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartKernelAs starts a kernel as u, with no server, as StartKernel does:
// `python -m ipykernel_launcher -f <u's runtime dir>/kernel-<id>.json`,
// u's HOME, env appended (JPY_SESSION_NAME names its notebook, as
// jupyter_server 2 sets it). It returns once the kernel wrote its file.
func StartKernelAs(t testing.TB, u User, env ...string) *Kernel {
	t.Helper()
	Require(t, "ipykernel")
	id := fmt.Sprintf("%s-%s-%s-%s-%s", RandomHex(4), RandomHex(2), RandomHex(2), RandomHex(2), RandomHex(6))
	rt := u.RuntimeDir()
	if _, _, err := u.Run(nil, "mkdir", "-p", "-m", "0700", rt); err != nil {
		t.Fatalf("mkdir %s as %s: %v", rt, u.Name, err)
	}
	cf := filepath.Join(rt, "kernel-"+id+".json")
	base := []string{"JUPYTER_RUNTIME_DIR=" + rt, "PYTHONUNBUFFERED=1", "JUPYTER_PLATFORM_DIRS=1", "OMP_NUM_THREADS=1",
		"PYDEVD_DISABLE_FILE_VALIDATION=1", "IPYTHONDIR=" + filepath.Join(u.Home, ".ipython")}
	cmd := u.Command(append(base, env...), Python(), "-m", "ipykernel_launcher", "-f", cf)
	cmd.SysProcAttr.Setpgid = true
	p := &Proc{Cmd: cmd, Log: &bytes.Buffer{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	cmd.Stdout = lockedWriter{p.mu, p.Log}
	cmd.Stderr = lockedWriter{p.mu, p.Log}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a kernel as %s: %v", u.Name, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		p.Kill()
	})
	var conn struct {
		Key       *string `json:"key"`
		ShellPort int     `json:"shell_port"`
		HBPort    int     `json:"hb_port"`
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(cf); err == nil && json.Unmarshal(b, &conn) == nil &&
			conn.Key != nil && conn.ShellPort > 0 && conn.HBPort > 0 {
			break
		}
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("kernel of %s did not write %s: %s", u.Name, cf, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &Kernel{Proc: p, Dir: t.TempDir(), ConnectionFile: cf, Key: *conn.Key, ID: id}
}
