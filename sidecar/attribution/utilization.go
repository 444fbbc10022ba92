package attribution

import "github.com/gpumem/gpumem/nvml"

// AddUtilization charges NVML's per-process utilization as Attribute
// charged memory: each process's share of each GPU, each notebook's (its
// processes summed, children included), each other process's and each
// GPU's. A figure is known only when every reading behind it is: a device
// that cannot say (no nvmlDeviceGetProcessUtilization, MIG, an error)
// makes it nil, never 0. snap is the one the report was attributed from;
// calling it again recomputes the same figures.
func AddUtilization(r *Report, snap nvml.Snapshot) {
	type key struct{ gpu, pid int }
	per := map[key]*share{}
	devices := map[int]*share{}
	allKnown := len(snap.Devices) > 0
	for _, d := range snap.Devices {
		dev := &share{known: d.UtilizationMissing == ""}
		devices[d.Index] = dev
		allKnown = allKnown && dev.known
		for _, p := range d.Processes {
			k := key{d.Index, p.PID}
			s := per[k]
			if s == nil {
				s = &share{known: true}
				per[k] = s
			}
			s.add(p.Util) // a pid on two MIG instances of one GPU: both count
			dev.add(p.Util)
		}
	}
	set := func(pid int, perGPU []GPUBytes) {
		for i := range perGPU {
			s := per[key{perGPU[i].Index, pid}]
			if s == nil {
				perGPU[i].Utilization = nil
				continue
			}
			perGPU[i].Utilization = s.figure()
		}
	}
	for i := range r.Notebooks {
		nb := &r.Notebooks[i]
		byGPU := map[int]*share{}
		for _, p := range nb.Processes {
			set(p.PID, p.PerGPU)
			for _, pg := range p.PerGPU {
				s := byGPU[pg.Index]
				if s == nil {
					s = &share{known: true}
					byGPU[pg.Index] = s
				}
				s.addFigure(pg.Utilization)
			}
		}
		total := &share{known: allKnown || len(nb.PerGPU) > 0}
		for j := range nb.PerGPU {
			s := byGPU[nb.PerGPU[j].Index]
			if s == nil {
				nb.PerGPU[j].Utilization = nil
				total.known = false
				continue
			}
			nb.PerGPU[j].Utilization = s.figure()
			total.addFigure(nb.PerGPU[j].Utilization)
		}
		// Without GPU processes the notebook computes nothing, as far as
		// GPUs that can say tell (allKnown); one that cannot leaves it unknown.
		nb.Utilization = total.sum()
	}
	for i := range r.Other {
		set(r.Other[i].PID, r.Other[i].PerGPU)
	}
	for i := range r.GPUs {
		g := &r.GPUs[i]
		g.Utilization, g.UtilizationMissing = nil, ""
		for _, d := range snap.Devices {
			if d.Index == g.Index {
				g.Utilization, g.UtilizationMissing = devices[d.Index].figure(), d.UtilizationMissing
			}
		}
	}
}

// share adds up readings; known while every one is.
type share struct {
	known   bool
	sm, mem uint32
}

func (s *share) add(u nvml.Utilization) {
	s.known = s.known && u.Known
	s.sm += u.SMPercent
	s.mem += u.MemoryPercent
}

func (s *share) addFigure(u *Utilization) {
	if u == nil {
		s.known = false
		return
	}
	s.sm += u.SMPercent
	s.mem += u.MemoryPercent
}

// figure is the share of one GPU: at most 100 (processes running at once
// under MPS may sum to more).
func (s *share) figure() *Utilization {
	if !s.known {
		return nil
	}
	return &Utilization{SMPercent: min(s.sm, 100), MemoryPercent: min(s.mem, 100)}
}

// sum is a share over several GPUs: not capped.
func (s *share) sum() *Utilization {
	if !s.known {
		return nil
	}
	return &Utilization{SMPercent: s.sm, MemoryPercent: s.mem}
}
