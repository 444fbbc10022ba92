package attribution

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"testing"
)

// addHoldersPerGPU is addHolders as each GPU once read it: every GPU
// looking through every notebook and process. It sets each GPU's Holders (its notebooks and other processes
// holding memory there, ranked) and HoldersByUser (the same by user).
func addHoldersPerGPU(r *Report) {
	for i := range r.GPUs {
		g := &r.GPUs[i]
		g.Holders, g.HoldersByUser = nil, nil
		// Counted first: a host's thousands of holders are spread over its
		// GPUs, and growing each GPU's list by appends was most of what a
		// sample allocated here.
		n := 0
		for _, nb := range r.Notebooks {
			if b, ok := bytesOn(nb.PerGPU, g.Index); ok && b != 0 {
				n++
			}
		}
		for _, o := range r.Other {
			if b, ok := bytesOn(o.PerGPU, g.Index); ok && b != 0 {
				n++
			}
		}
		if n > 0 {
			g.Holders = make([]Holder, 0, n)
		}
		byUser := map[string]*Holder{}
		user := func(name string) *Holder {
			u, ok := byUser[name]
			if !ok {
				u = &Holder{Kind: HolderUser, Name: "user " + name, User: name}
				byUser[name] = u
			}
			return u
		}
		for _, nb := range r.Notebooks {
			b, ok := bytesOn(nb.PerGPU, g.Index)
			if !ok || b == 0 {
				continue
			}
			g.Holders = append(g.Holders, Holder{Kind: HolderNotebook, Name: nb.DisplayName, User: nb.User, Bytes: b,
				KernelID: nb.KernelID, ConnectionFile: nb.ConnectionFile})
			u := user(holderUser(nb.User))
			u.Bytes += b
			u.Notebooks++
		}
		for _, o := range r.Other {
			b, ok := bytesOn(o.PerGPU, g.Index)
			if !ok || b == 0 {
				continue
			}
			g.Holders = append(g.Holders, Holder{Kind: HolderProcess, Name: "pid " + strconv.Itoa(o.PID) + " (" + o.User + ")",
				User: o.User, Bytes: b, PID: o.PID, Command: cutRunes(o.Command, commandRunes)})
			u := user(holderUser(o.User))
			u.Bytes += b
			u.Processes++
		}
		for _, u := range byUser {
			g.HoldersByUser = append(g.HoldersByUser, *u)
		}
		rankHolders(g.Holders)
		rankHolders(g.HoldersByUser)
	}
}

// bytesOn is the bytes of per on GPU index, and whether per names it.
func bytesOn(per []GPUBytes, index int) (uint64, bool) {
	for _, pg := range per {
		if pg.Index == index {
			return pg.Bytes, true
		}
	}
	return 0, false
}

// addHolders, one pass over the notebooks and processes, gives each GPU
// the holders a pass per GPU gives it, in the same order: over reports
// with ties of bytes and names, zero bytes, a process on several GPUs, an
// index listed twice in a PerGPU, a GPU no one holds, GPUs out of order.
func TestHoldersOnePass(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		var rep Report
		gpus := rng.Perm(1 + rng.IntN(8))
		for _, i := range gpus {
			rep.GPUs = append(rep.GPUs, GPU{Index: i})
		}
		per := func() []GPUBytes {
			var out []GPUBytes
			for range rng.IntN(4) {
				out = append(out, GPUBytes{Index: rng.IntN(9), Bytes: uint64(rng.IntN(3)) << 30})
			}
			return out
		}
		users := []string{"", "alice", "bob"}
		for k := range rng.IntN(40) {
			rep.Notebooks = append(rep.Notebooks, Notebook{KernelID: strconv.Itoa(k), ConnectionFile: fmt.Sprintf("/k%d.json", k),
				DisplayName: fmt.Sprintf("nb%d", rng.IntN(5)), User: users[rng.IntN(3)], PerGPU: per()})
		}
		for p := range rng.IntN(40) {
			rep.Other = append(rep.Other, OtherProcess{PID: 100 + p%7, User: users[rng.IntN(3)], Command: "python x", PerGPU: per()})
		}
		want := rep
		want.GPUs = slices.Clone(rep.GPUs)
		addHoldersPerGPU(&want)
		addHolders(&rep, FinishInput{})
		if !reflect.DeepEqual(rep.GPUs, want.GPUs) {
			t.Fatalf("trial %d:\n got  %+v\n want %+v", trial, rep.GPUs, want.GPUs)
		}
	}
}
