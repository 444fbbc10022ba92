package testenv

import (
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// exitedPid starts a process, lets it exit and reaps it: its number is free.
func exitedPid(t *testing.T, setpgid bool) int {
	t.Helper()
	cmd := exec.Command("true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: setpgid}
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func endLater(t *testing.T, cmd *exec.Cmd) {
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// Proc.Kill signals its group only while no other process has the
// leader's number: a group whose id was reused is another process's.
func TestProcKillSparesAReusedGroup(t *testing.T) {
	var victim *exec.Cmd
	t.Run("start", func(t *testing.T) {
		for range 10 { // a leader whose number something else took: another
			p := Start(t, nil, t.TempDir(), "true")
			Poll(t, 10*time.Second, "the process to exit", p.Exited)
			// pid and start time name a process: a victim started in the
			// same clock tick as the leader is indistinguishable from it,
			// so take one of a later tick.
			for range 50 {
				victim = StartAsPid(t, p.Cmd.Process.Pid, true, "sleep", "600")
				if victim == nil {
					break
				}
				if s, _ := procStart(victim.Process.Pid); s != p.start {
					return
				}
				_ = victim.Process.Kill()
				_ = victim.Wait()
				victim = nil
			}
		}
		t.Fatal("no victim started as the leader's number in another clock tick in 10 tries")
	}) // its cleanup is the Kill
	endLater(t, victim)
	if !Alive(victim.Process.Pid) {
		t.Fatalf("Proc.Kill killed group %d, led by a process started after its own leader exited", victim.Process.Pid)
	}
	// Its own live group, it kills.
	var own *Proc
	t.Run("own", func(t *testing.T) { own = Start(t, nil, t.TempDir(), "sleep", "600") })
	if !own.Exited() {
		t.Fatal("Proc.Kill left its own live process")
	}
}

// The reaper and KillIf signal a process only through a pidfd of their
// own, taken while they knew it: a process that took the number of one
// that exited is spared.
func TestKillersSpareAReusedPid(t *testing.T) {
	// The new process leads its own group or not: the reaper kills both a
	// pid and the group it leads, and must spare either.
	for _, setpgid := range []bool{true, false} {
		var victim *exec.Cmd
		t.Run(fmt.Sprintf("reaper/setpgid=%v", setpgid), func(t *testing.T) {
			r := NewReaper(t, nil)
			for range 10 { // a number something else took: another
				cmd := exec.Command("sleep", "600")
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				r.Add(cmd.Process.Pid)
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				if victim = StartAsPid(t, cmd.Process.Pid, setpgid, "sleep", "600"); victim != nil {
					return
				}
			}
			t.Fatal("no process started as a reaped one's number in 10 tries")
		}) // the subtest's cleanup reaps
		if victim == nil {
			t.FailNow()
		}
		endLater(t, victim)
		if !Alive(victim.Process.Pid) {
			t.Fatalf("the reaper killed pid %d, which took the number of the process it was given (setpgid %v)", victim.Process.Pid, setpgid)
		}
	}

	pid := exitedPid(t, false)
	looked := false
	if KillIf(pid, func(int) bool { looked = true; return true }) || looked {
		t.Fatalf("KillIf of a pid no process has: signalled or looked")
	}
	var other *exec.Cmd
	for i := 0; other == nil; i++ {
		if i == 10 {
			t.Fatal("no process started as an exited one's number in 10 tries")
		}
		other = StartAsPid(t, exitedPid(t, false), false, "sleep", "600")
	}
	endLater(t, other)
	if KillIf(other.Process.Pid, func(int) bool { return false }) || !Alive(other.Process.Pid) {
		t.Fatal("KillIf signalled a process its check refused")
	}
	if !KillIf(other.Process.Pid, func(int) bool { return true }) {
		t.Fatal("KillIf did not signal a process its check accepted")
	}
	_ = other.Wait()
}

// MakeUser's cleanup ends the processes of its user, through KillIf, and
// removes the account.
func TestMakeUserCleanupEndsItsProcesses(t *testing.T) {
	var pid int
	var name string
	t.Run("user", func(t *testing.T) {
		u := MakeUser(t, "reap")
		name = u.Name
		cmd := u.Command(nil, "sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid = cmd.Process.Pid
		go func() { _ = cmd.Wait() }()
	})
	Poll(t, 10*time.Second, "the user's process to be gone", func() bool { return !Alive(pid) })
	if err := exec.Command("id", name).Run(); err == nil {
		t.Errorf("user %s still exists", name)
	}
}
