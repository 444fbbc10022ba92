package daemon

import (
	"fmt"
	"slices"
)

// childPlan is what free --children does with one process of a live
// kernel's recorded tree that holds GPU memory, and why.
type childPlan struct {
	decision // reclaim's checks; Kill and Reason are free --children's outcome
	j        judgement
	// confirm: left running for what it computes (or because that is
	// unknown); confirming its pid ends it.
	confirm bool
}

// planChildren is free --children's policy, pure. decs are reclaim's
// decisions over the kernel's recorded tree (reclaimPolicy.decide: alive
// with its recorded start time, the kernel's user's, in the kernel's pod,
// in no other kernel's tree), judge the verdict of each over the compute
// window, confirmed the pids the user confirmed (none: the idle only).
//
//   - reclaim's refusal stands: confirming a pid never ends a process
//     reclaim would not end, nor one outside the kernel's recorded tree
//     (such a pid comes back in notFound);
//   - with pids confirmed, those are ended whatever they compute, and
//     only they;
//   - without, a process is ended as reclaim ends a survivor
//     (ComputeConfig.mayEnd): idle by its own readings over the window;
//     computing, or unknown, it is left running, to be confirmed.
func planChildren(decs []decision, judge func(procID) judgement, cfg ComputeConfig, confirmed []int) (plans []childPlan, notFound []int) {
	matched := map[int]bool{}
	for _, dec := range decs {
		p := childPlan{decision: dec, j: judge(dec.ID)}
		asked := slices.Contains(confirmed, dec.ID.PID)
		if asked {
			matched[dec.ID.PID] = true
		}
		switch {
		case !dec.Kill:
			// Another kernel's, another user's, another pod's: whatever
			// was confirmed.
		case asked:
			p.Reason = ""
		case len(confirmed) > 0:
			p.Kill, p.Reason = false, fmt.Sprintf("not among the pids confirmed (%s): left alone", pidList(confirmed))
		default:
			ok, why := cfg.mayEnd(p.j)
			p.Kill, p.Reason, p.confirm = ok, why, !ok
		}
		plans = append(plans, p)
	}
	for _, pid := range confirmed {
		if !matched[pid] {
			notFound = append(notFound, pid)
		}
	}
	slices.SortFunc(plans, func(a, b childPlan) int { return a.ID.PID - b.ID.PID })
	return plans, notFound
}

// settlingLeft reports whether a process plans would end, or leave for
// want of readings alone, is still settling: its verdict may change with
// the next readings, and free --children waits for them, as reclaim
// watches a dead kernel's survivors for its grace window.
func settlingLeft(plans []childPlan) bool {
	for _, p := range plans {
		if p.confirm && p.j.verdict == verdictUnknown && p.j.settling {
			return true
		}
	}
	return false
}

func pidList(pids []int) string {
	s := ""
	for i, pid := range pids {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprint(pid)
	}
	return s
}
