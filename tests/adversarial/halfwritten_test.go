package adversarial

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestNoDeleteAdviceForALiveServersFile: a server writes its
// jpserver-<pid>.json in place, so a scan can read it half-written while
// the server starts. gpumem never tells the user to delete the file of a
// server whose process lives (the CLI and the daemon alike); the file of a
// server that is gone, it does.
func TestNoDeleteAdviceForALiveServersFile(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	rt := filepath.Join(dir, "runtime")
	_, nums := pyProc(t, "import os, time; print(os.getpid(), flush=True); time.sleep(600)")
	live := filepath.Join(rt, fmt.Sprintf("jpserver-%d.json", nums[0]))
	dead := filepath.Join(rt, "jpserver-999999999.json")
	for _, f := range []string{live, dead} {
		if err := os.WriteFile(f, []byte(`{"base_url": "/", "hostname": "127.0.0.1", "pid": `), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	check := func(who, text string) {
		t.Helper()
		for _, line := range strings.Split(text, "\n") {
			if strings.Contains(line, filepath.Base(live)) && strings.Contains(line, "delete") {
				t.Errorf("%s advises deleting a live server's file: %s", who, line)
			}
		}
		if !strings.Contains(text, filepath.Base(dead)) || !strings.Contains(text, "is gone: delete the file") {
			t.Errorf("%s does not advise deleting the dead server's file:\n%s", who, text)
		}
	}
	_, stderr, _ := gpumem(t, dir, testenv.NewFakeGPU(t), "kernels")
	check("gpumem kernels", stderr)
	d := testenv.StartDaemon(t, gpumemBin, dir, testenv.NewFakeGPU(t))
	d.WaitLog(t, 15*time.Second, "discovery", map[string]any{"error": "~" + filepath.Base(dead)})
	check("gpumem serve", d.Output())
}
