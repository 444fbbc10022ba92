package adversarial

import (
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// A notebook's name is its user's to choose, and root's terminal shows it:
// user B (a real account) opens a notebook whose path clears the screen,
// homes the cursor and draws a fake GPU line, under a real Jupyter server
// of theirs. Root's `gpumem ls`, `ls --idle`, `kernels` (through a root
// --all-users daemon) and the candidates an `attach` error lists must show
// it escaped: no control character reaches the terminal and no line of
// the output is the notebook's.
func TestNotebookNamesReachTerminalsEscaped(t *testing.T) {
	t.Parallel()
	testenv.RequireRoot(t, "user B's server runs under a real account")
	b := testenv.MakeUser(t, "nbesc")
	srv := testenv.StartServerWith(t, testenv.NotebookServer(), testenv.ServerOptions{As: &b})
	const fake = "GPU 0  FAKE GPU  0 B / 80.0 GiB used (0%)"
	path := "team/\x1b[2J\x1b[H\x1b]0;owned\x07\n" + fake + "\n\u202eevil.ipynb"
	sess := srv.CreateSession(t, path)
	pids := testenv.KernelPIDs(srv.ConnectionFile(sess.Kernel.ID))
	if len(pids) != 1 {
		t.Fatalf("kernel pids %v", pids)
	}
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: pids[0], UsedBytes: 2 << 30})
	dir := jupyterDir(t)
	// Its log in the console format, as a terminal shows it (the last
	// --log-format given wins).
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--all-users", "--users="+b.Name, "--interval=200ms", "--no-inject",
		"--log-format=console")
	testenv.Poll(t, 60*time.Second, "the daemon names B's notebook", func() bool {
		for _, nb := range d.Report(t).Notebooks {
			if nb.KernelID == sess.Kernel.ID && strings.Contains(nb.Notebook, "evil.ipynb") && nb.GPUMemoryBytes > 0 {
				return true
			}
		}
		return false
	})
	run := func(args ...string) string {
		t.Helper()
		stdout, stderr, err := gpumemWith(t, dir, gpu, []string{"GPUMEM_SOCKET=" + d.Socket}, args...)
		if err != nil && args[0] != "attach" {
			t.Fatalf("gpumem %v: %v\n%s", args, err, stderr)
		}
		return stdout + stderr
	}
	outputs := map[string]string{}
	for _, args := range [][]string{{"ls"}, {"ls", "--idle"}, {"kernels"},
		{"attach", "no-such-kernel", "--runtime-dir=" + srv.RuntimeDir()}} {
		outputs["gpumem "+strings.Join(args[:min(2, len(args))], " ")] = run(args...)
	}
	testenv.Poll(t, 30*time.Second, "the daemon's log names B's notebook", func() bool {
		return strings.Contains(d.Output(), "evil.ipynb")
	})
	outputs["the daemon's console log"] = d.Output()
	for what, out := range outputs {
		if !strings.Contains(out, "evil.ipynb") {
			t.Errorf("%s does not show B's notebook:\n%s", what, out)
		}
		for i, r := range out {
			if (r < 0x20 && r != '\n') || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x202e {
				t.Errorf("%s writes %U to the terminal at byte %d:\n%q", what, r, i, out)
				break
			}
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "GPU 0  FAKE") {
				t.Errorf("%s: B's notebook drew a line of its own: %q", what, line)
			}
		}
	}
}
