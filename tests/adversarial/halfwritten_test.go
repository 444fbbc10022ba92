package adversarial

import (
	"fmt"
	"net/http"
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

// TestNoDamagedAlarmForKernelsStarting: jupyter_client writes a kernel's
// connection file in place and ipykernel rewrites it at start-up, at
// every start and restart, so a scan woken by that write reads it empty
// or cut short. A daemon watching kernels start and restart logs no
// "damaged" warning for their files; a junk file beside them, which stays
// junk, is still warned about, once.
func TestNoDamagedAlarmForKernelsStarting(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel", "jupyter_client")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	reap := testenv.NewReaper(t, srv)
	junk := filepath.Join(srv.RuntimeDir(), "kernel-"+testenv.NewKernelID()+".json")
	if err := os.WriteFile(junk, []byte(`{"shell_port": 1, "key": `), 0o600); err != nil {
		t.Fatal(err)
	}
	d := testenv.StartDaemon(t, gpumemBin, srv.Dir, testenv.NewFakeGPU(t), "--interval=200ms", "--rescan=300ms")
	d.WaitLog(t, 15*time.Second, "discovery", map[string]any{"error": "~" + filepath.Base(junk)})
	const kernels = 4
	var ids []string
	for i := range kernels {
		sess := srv.CreateSession(t, fmt.Sprintf("starting/nb%d.ipynb", i))
		ids = append(ids, sess.Kernel.ID)
		reap.Add(testenv.KernelPID(t, srv.ConnectionFile(sess.Kernel.ID)))
	}
	for _, id := range ids {
		d.WaitLog(t, 60*time.Second, "attached", map[string]any{"kernel_id": id})
	}
	for _, id := range ids {
		from := d.LogCount()
		srv.JSON(t, http.MethodPost, "api/kernels/"+id+"/restart", nil, nil)
		d.WaitLogSince(t, 60*time.Second, from, "kernel restarted", map[string]any{"kernel_id": id})
		reap.Add(testenv.KernelPID(t, srv.ConnectionFile(id)))
	}
	told := 0
	for _, l := range d.Logs("discovery", nil) {
		msg, _ := l["error"].(string)
		if l["level"] != "warn" {
			continue
		}
		if strings.Contains(msg, filepath.Base(junk)) {
			told++
			if strings.Contains(msg, "restart the kernel") {
				t.Errorf("restarting a kernel is advised for a file no kernel names: %s", msg)
			}
		}
		for _, id := range ids {
			if strings.Contains(msg, id) && strings.Contains(msg, "damaged") {
				t.Errorf("a kernel starting or restarting is warned about as damaged: %s", msg)
			}
		}
	}
	if told != 1 {
		t.Errorf("the junk file is warned about %d times, want once:\n%s", told, d.Output())
	}
}
