package daemon

import (
	"context"
	"errors"
	"maps"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/procs"
)

func TestReclaimPolicy(t *testing.T) {
	table := procs.NewTable([]procs.Proc{
		{PID: 100, PPID: 1, StartTime: 500, Detailed: true, UID: 1000, Argv: []string{"python", "worker.py"}},
		{PID: 101, PPID: 1, StartTime: 900, Detailed: true, UID: 1000}, // pid 101 reused: recorded start 600
		{PID: 102, PPID: 1, StartTime: 700, Detailed: true, UID: 1001}, // another user
		{PID: 103, PPID: 1, StartTime: 710, Detailed: true, UID: 1000}, // holds no GPU memory
		{PID: 104, PPID: 1, StartTime: 720, Detailed: true, UID: 1000}, // in a live kernel's tree
	})
	recorded := map[procID]recordedProc{
		{100, 500}: {UID: 1000, Argv: "python worker.py"},
		{101, 600}: {UID: 1000},
		{102, 700}: {UID: 1001},
		{103, 710}: {UID: 1000},
		{104, 720}: {UID: 1000},
		{105, 730}: {UID: 1000}, // exited
	}
	gpu := map[int]uint64{100: 1 << 30, 101: 1 << 30, 102: 2 << 30, 104: 3 << 30, 105: 1}
	holder := func(pid int) (uint64, bool) { b, ok := gpu[pid]; return b, ok }

	for _, tc := range []struct {
		name     string
		policy   reclaimPolicy
		wantKill map[int]bool // pid → kill? (absent: not decided on at all)
	}{
		{
			name:     "own user only",
			policy:   reclaimPolicy{selfUID: 1000, keep: map[procID]bool{{104, 720}: true}, gpuHolder: holder},
			wantKill: map[int]bool{100: true, 102: false, 104: false},
		},
		{
			name:     "root with --reclaim-all-users",
			policy:   reclaimPolicy{selfUID: 0, allUsers: true, keep: map[procID]bool{{104, 720}: true}, gpuHolder: holder},
			wantKill: map[int]bool{100: true, 102: true, 104: false},
		},
		{
			name:     "root without --reclaim-all-users touches no user's process",
			policy:   reclaimPolicy{selfUID: 0, keep: map[procID]bool{}, gpuHolder: holder},
			wantKill: map[int]bool{100: false, 102: false, 104: false},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[int]bool{}
			for _, d := range tc.policy.decide(recorded, table) {
				got[d.ID.PID] = d.Kill
				if !d.Kill && d.Reason == "" {
					t.Errorf("pid %d left alone without a reason", d.ID.PID)
				}
			}
			if len(got) != len(tc.wantKill) {
				t.Errorf("decided on %v, want %v", got, tc.wantKill)
			}
			for pid, want := range tc.wantKill {
				if k, ok := got[pid]; !ok || k != want {
					t.Errorf("pid %d: kill=%v (decided %v), want kill=%v", pid, k, ok, want)
				}
			}
		})
	}
}

// startSleeper starts a real process in a new session, as an orphan-prone
// worker would be, and reaps it in the background.
func startSleeper(t *testing.T, ignoreTERM bool) (*exec.Cmd, procID, <-chan struct{}) {
	t.Helper()
	script := "exec sleep 600"
	if ignoreTERM {
		script = "trap '' TERM; echo ready; while :; do sleep 1; done"
	}
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if ignoreTERM {
		buf := make([]byte, 6)
		if _, err := out.Read(buf); err != nil { // the trap is set once it says so
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	table, err := (&procs.FS{}).ScanTree(nil)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := table.Get(cmd.Process.Pid)
	if !ok {
		t.Fatalf("started pid %d not in /proc", cmd.Process.Pid)
	}
	return cmd, procID{p.PID, p.StartTime}, done
}

func TestTerminate(t *testing.T) {
	t.Run("SIGTERM ends it", func(t *testing.T) {
		_, id, done := startSleeper(t, false)
		killed, err := terminate(context.Background(), &procs.FS{}, id, 5*time.Second)
		if err != nil || killed {
			t.Fatalf("terminate = killed %v, %v; want ended by SIGTERM", killed, err)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("process still running")
		}
	})
	t.Run("SIGKILL after grace", func(t *testing.T) {
		_, id, done := startSleeper(t, true)
		start := time.Now()
		killed, err := terminate(context.Background(), &procs.FS{}, id, 300*time.Millisecond)
		if err != nil || !killed {
			t.Fatalf("terminate = killed %v, %v; want SIGKILL", killed, err)
		}
		if el := time.Since(start); el < 300*time.Millisecond {
			t.Errorf("SIGKILL after %v, before the grace", el)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("process still running")
		}
	})
	t.Run("reused pid is never signalled", func(t *testing.T) {
		_, id, done := startSleeper(t, false)
		stale := procID{id.PID, id.Start - 1} // what we recorded was an older process with this pid
		_, err := terminate(context.Background(), &procs.FS{}, stale, time.Second)
		if !errors.Is(err, errStale) {
			t.Fatalf("terminate = %v, want errStale", err)
		}
		select {
		case <-done:
			t.Fatal("the process now holding the pid was ended")
		default:
		}
		if err := syscall.Kill(id.PID, 0); err != nil {
			t.Fatalf("process gone: %v", err)
		}
	})
	t.Run("gone already", func(t *testing.T) {
		cmd, id, done := startSleeper(t, false)
		_ = cmd.Process.Kill()
		<-done
		if _, err := terminate(context.Background(), &procs.FS{}, id, time.Second); err != nil {
			t.Fatalf("terminate of an exited process = %v", err)
		}
	})
}

// TestObserveRecordsTreeAndForgetsExited: the tree of a live kernel is
// recorded (children, setsid grandchildren while still descendants), an
// orphan that left the tree but lives stays recorded, exited processes are
// forgotten, and a kernel whose pid was reused counts as gone.
func TestObserveRecordsTreeAndForgetsExited(t *testing.T) {
	kernel := procID{100, 1000}
	ks := &kernelState{id: "k", cur: kernel, recorded: map[procID]recordedProc{
		{150, 1100}: {UID: 7}, // left the tree (its parent exited), still alive
		{160, 1200}: {UID: 7}, // exited
	}}
	table := procs.NewTable([]procs.Proc{
		{PID: 100, PPID: 1, PGID: 100, SID: 100, StartTime: 1000, Detailed: true, UID: 7},
		{PID: 101, PPID: 100, PGID: 100, SID: 100, StartTime: 1010, Detailed: true, UID: 7, Argv: []string{"python", "-c", "worker"}},
		{PID: 102, PPID: 101, PGID: 102, SID: 102, StartTime: 1020}, // setsid grandchild, still a descendant
		{PID: 150, PPID: 1, PGID: 150, SID: 150, StartTime: 1100},
		{PID: 300, PPID: 1, PGID: 300, SID: 300, StartTime: 1300}, // unrelated
	})
	if !ks.observe(table) {
		t.Fatal("live kernel reported gone")
	}
	want := map[procID]bool{{101, 1010}: true, {102, 1020}: true, {150, 1100}: true}
	if len(ks.recorded) != len(want) {
		t.Errorf("recorded %v, want %v", ks.recorded, want)
	}
	for id := range want {
		if _, ok := ks.recorded[id]; !ok {
			t.Errorf("%v not recorded", id)
		}
	}
	if got := ks.recorded[procID{101, 1010}]; got.Argv != "python -c worker" || got.UID != 7 {
		t.Errorf("worker recorded as %+v", got)
	}
	reused := procs.NewTable([]procs.Proc{{PID: 100, PPID: 1, StartTime: 5000}})
	if ks.observe(reused) {
		t.Error("a reused kernel pid was taken for the kernel")
	}
}

// TestReclaimPolicyPods: with pod kernels followed, an orphan counts only in
// the dead kernel's own pod. Every other process below looks exactly like
// the orphan (recorded in the tree, alive, same user, holding GPU memory)
// and differs only in its pod.
func TestReclaimPolicyPods(t *testing.T) {
	const podA, podB = "0b1c2d3e-0000-4000-8000-00000000000a", "0b1c2d3e-0000-4000-8000-00000000000b"
	table := procs.NewTable([]procs.Proc{
		{PID: 200, PPID: 1, StartTime: 500, Detailed: true, UID: 1000}, // in pod A
		{PID: 201, PPID: 1, StartTime: 501, Detailed: true, UID: 1000}, // in pod B
		{PID: 202, PPID: 1, StartTime: 502, Detailed: true, UID: 1000}, // outside any pod
		{PID: 203, PPID: 1, StartTime: 503, Detailed: true, UID: 1000}, // cgroup unreadable
	})
	recorded := map[procID]recordedProc{}
	for _, p := range table.All() {
		recorded[procID{p.PID, p.StartTime}] = recordedProc{UID: 1000}
	}
	podOf := func(id procID) (string, error) {
		switch id.PID {
		case 200:
			return podA, nil
		case 201:
			return podB, nil
		case 202:
			return "", nil
		}
		return "", errors.New("read cgroup of pid 203: no such process")
	}
	holder := func(int) (uint64, bool) { return 1 << 30, true }
	for _, tc := range []struct {
		name       string
		pod        string
		podOf      func(procID) (string, error)
		wantKill   map[int]bool
		wantReason map[int]string
	}{
		{
			name: "kernel in pod A", pod: podA, podOf: podOf,
			wantKill:   map[int]bool{200: true, 201: false, 202: false, 203: false},
			wantReason: map[int]string{201: "in pod " + podB + ", not the kernel's pod " + podA, 202: "outside any pod", 203: "cannot be read"},
		},
		{
			name: "kernel in pod B", pod: podB, podOf: podOf,
			wantKill: map[int]bool{200: false, 201: true, 202: false, 203: false},
		},
		{
			name: "host kernel with pod kernels followed", pod: "", podOf: podOf,
			wantKill:   map[int]bool{200: false, 201: false, 202: true, 203: false},
			wantReason: map[int]string{200: "the kernel ran outside any pod"},
		},
		{
			name: "pods not followed: no pod rule", pod: "", podOf: nil,
			wantKill: map[int]bool{200: true, 201: true, 202: true, 203: true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := reclaimPolicy{selfUID: 1000, keep: map[procID]bool{}, gpuHolder: holder, pod: tc.pod, podOf: tc.podOf}
			got := map[int]bool{}
			for _, d := range p.decide(recorded, table) {
				got[d.ID.PID] = d.Kill
				if want, ok := tc.wantReason[d.ID.PID]; ok && !strings.Contains(d.Reason, want) {
					t.Errorf("pid %d: reason %q, want it to say %q", d.ID.PID, d.Reason, want)
				}
			}
			if !maps.Equal(got, tc.wantKill) {
				t.Errorf("kill decisions %v, want %v", got, tc.wantKill)
			}
		})
	}
}
