package adversarial

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// Under --all-users, a dir that a user's process names in its argv
// ("-f DIR/kernel-x.json") is scanned as that user's runtime dir. User B
// (a real account) runs 600 short-lived processes, each naming a dir of
// its own: the daemon must forget each dir once nothing names it, hold no
// descriptor for a dir without a followed kernel, and scan no more than a
// few of one user's dirs at a time. Measured: its open descriptors
// (/proc/<pid>/fd) during and after.
func TestShortLivedProcessesNamingDirsAreForgotten(t *testing.T) {
	t.Parallel()
	testenv.RequireRoot(t, "user B is a real account; the daemon runs as root with --all-users")
	b := testenv.MakeUser(t, "dirs")
	mkdirAs(t, b, b.RuntimeDir())
	d := testenv.StartDaemon(t, gpumemBin, jupyterDir(t), testenv.NewFakeGPU(t), "--all-users", "--users="+b.Name,
		"--no-inject", "--rescan=100ms")
	d.WaitLog(t, 30*time.Second, "watching a user's runtime dir", map[string]any{"runtime_dir": b.RuntimeDir()})
	pid := d.Cmd.Process.Pid
	fds := func() int {
		entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatalf("the daemon's fds: %v", err)
		}
		return len(entries)
	}
	base := fds()

	// 600 processes, 30 at a time, each living 0.4 s and naming its own
	// dir; the rescans every 100 ms see most of them.
	spawn := fmt.Sprintf(`cd %q
for i in $(seq 1 600); do
  mkdir -p d$i
  sh -c 'sleep 0.4' sh -f "$PWD/d$i/kernel-1.json" &
  if [ $((i %% 30)) -eq 0 ]; then sleep 0.3; fi
done
wait`, b.Home)
	cmd := b.Command(nil, "/bin/bash", "-c", spawn)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	most := base
	deadline := time.After(2 * time.Minute)
wait:
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("B's processes: %v", err)
			}
			break wait
		case <-deadline:
			t.Fatal("B's 600 processes did not finish in 2 min")
		case <-time.After(50 * time.Millisecond):
			most = max(most, fds())
		}
	}
	if n := len(d.Logs("watching a user's runtime dir", nil)); n < 20 {
		t.Fatalf("the daemon saw %d of B's dirs: the test did not reach it", n)
	}
	// Nothing names the dirs now: within a few rescans they are forgotten.
	var after int
	testenv.Eventually(15*time.Second, func() bool { after = fds(); return after <= base+4 })
	t.Logf("descriptors: %d before, %d at most while 600 processes named dirs, %d after; %d dirs seen",
		base, most, after, len(d.Logs("watching a user's runtime dir", nil)))
	if after > base+4 {
		t.Errorf("15 s after B's processes ended the daemon holds %d descriptors (%d before): their dirs are not forgotten", after, base)
	}
	if most > base+40 {
		t.Errorf("the daemon held %d descriptors while B's processes ran (%d before): one per dir named", most, base)
	}
}
