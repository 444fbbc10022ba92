package tests

import (
	"os/exec"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
)

// The reaper ends what it was given, never a process that took the number
// of one that had exited before the reap: a SIGKILL sent by number to a pid
// registered long ago (a papermill job's kernel, which papermill shut down)
// reaches whatever process has that number now, a server or the test
// binary of another package running beside this one.
func TestReaperSparesAReusedPid(t *testing.T) {
	var victim *exec.Cmd
	t.Run("reap", func(t *testing.T) {
		r := newReaper(t, nil)
		gone := exec.Command("sleep", "600")
		if err := gone.Start(); err != nil {
			t.Fatal(err)
		}
		r.add(gone.Process.Pid)
		_ = gone.Process.Kill()
		_ = gone.Wait() // reaped: its number is free
		victim = testenv.StartAsPid(t, gone.Process.Pid, false, "sleep", "600")
	}) // the subtest's cleanup reaps
	if victim == nil {
		return
	}
	defer func() { _ = victim.Process.Kill(); _ = victim.Wait() }()
	if !testenv.Alive(victim.Process.Pid) {
		t.Fatalf("the reaper killed pid %d, a process started after the one it was given had exited", victim.Process.Pid)
	}
}
