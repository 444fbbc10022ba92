package daemon

import (
	"fmt"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// procID identifies a process: pids are reused, (pid, start time) is not.
type procID struct {
	PID   int
	Start uint64
}

// candidate is a process recorded in a dead kernel's tree.
type candidate struct {
	ID    procID
	UID   uint32
	Argv  string
	Bytes uint64 // GPU memory it holds now (all GPUs)
}

// reclaimPolicy decides, purely, which recorded processes of a kernel that
// restarted or shut down may be ended.
type reclaimPolicy struct {
	selfUID   uint32
	allUsers  bool // root with --reclaim-all-users
	keep      map[procID]bool
	gpuHolder func(pid int) (bytes uint64, holds bool)
	// podOf, when set (pod kernels are followed), names the pod UID of a
	// process ("" outside any pod) from its cgroup; pod is the dead
	// kernel's ("" for a kernel of this host). A process counts only in
	// the same pod as the kernel whose tree recorded it: a process in
	// another pod, or outside any, is never ended for it, whatever else
	// it shares with the tree.
	pod   string
	podOf func(id procID) (string, error)
}

// decision is what to do with one recorded process, and why.
type decision struct {
	candidate
	Kill   bool
	Reason string
}

// decide returns a decision for each recorded process that is still alive
// (same pid and start time) in table and holds GPU memory. Processes that
// are gone, were replaced by a reused pid, or hold no GPU memory are left
// out: nothing is done to them and there is nothing to report.
func (p reclaimPolicy) decide(recorded map[procID]recordedProc, table *procs.Table) []decision {
	var out []decision
	for id, rec := range recorded {
		cur, ok := table.Lookup(id.PID, id.Start)
		if !ok {
			continue // exited, or its pid now names another process
		}
		bytes, holds := p.gpuHolder(id.PID)
		if !holds {
			continue
		}
		uid := rec.UID
		if cur.Detailed {
			uid = cur.UID
		}
		d := decision{candidate: candidate{ID: id, UID: uid, Argv: rec.Argv, Bytes: bytes}}
		podReason := p.podMismatch(id)
		switch {
		case p.keep[id]:
			d.Reason = "belongs to a live kernel"
		case podReason != "":
			d.Reason = podReason
		case uid != p.selfUID && !p.allUsers:
			d.Reason = fmt.Sprintf("owned by uid %d, not ours (run as root with --reclaim-all-users to reclaim it)", uid)
		default:
			d.Kill = true
		}
		out = append(out, d)
	}
	return out
}

// podMismatch says why process id is outside the dead kernel's pod, or ""
// when it is inside (or no pod rule applies).
func (p reclaimPolicy) podMismatch(id procID) string {
	if p.podOf == nil {
		return ""
	}
	pod, err := p.podOf(id)
	switch {
	case err != nil:
		return fmt.Sprintf("its pod cannot be read (%v): not proven to be in the kernel's pod", err)
	case pod == p.pod:
		return ""
	case pod == "":
		return fmt.Sprintf("outside any pod, the kernel ran in pod %s", p.pod)
	case p.pod == "":
		return fmt.Sprintf("in pod %s, the kernel ran outside any pod", pod)
	}
	return fmt.Sprintf("in pod %s, not the kernel's pod %s", pod, p.pod)
}
