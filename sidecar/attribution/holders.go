package attribution

import (
	"cmp"
	"slices"
	"strconv"
)

// Holder kinds.
const (
	HolderNotebook = "notebook"
	HolderProcess  = "process"
	HolderUser     = "user"
)

// Holder is one holder of a GPU's memory: a notebook, a process of no
// kernel, or (HoldersByUser, and a user's own view of a shared daemon) a
// user's notebooks and processes together.
type Holder struct {
	Kind string `json:"kind"` // HolderNotebook, HolderProcess or HolderUser
	// Name is what every face shows: the notebook's DisplayName, "pid <n>
	// (<user>)", or "user <name>".
	Name  string `json:"name"`
	User  string `json:"user"`
	Bytes uint64 `json:"bytes"`
	// KernelID and ConnectionFile name a notebook's kernel; PID and
	// Command a process.
	KernelID       string `json:"kernel_id,omitempty"`
	ConnectionFile string `json:"connection_file,omitempty"`
	PID            int    `json:"pid,omitempty"`
	Command        string `json:"command,omitempty"`
	// Notebooks and Processes count a user's, on this GPU.
	Notebooks int `json:"notebooks,omitempty"`
	Processes int `json:"processes,omitempty"`
}

// commandRunes bounds a holder's command: a name, not a command line.
const commandRunes = 60

// holderUser is the user a holder is counted for: "unknown" when /proc
// could not say.
func holderUser(user string) string {
	if user == "" {
		return "unknown"
	}
	return user
}

// rankHolders orders holders biggest first, ties by name.
func rankHolders(hs []Holder) {
	slices.SortStableFunc(hs, func(a, b Holder) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.Name, b.Name))
	})
}

// addHolders sets each GPU's Holders (its notebooks and other processes
// holding memory there, ranked) and HoldersByUser (the same by user).
func addHolders(r *Report, _ FinishInput) {
	// Each notebook and process is visited once, its bytes handed to the
	// GPUs it names, rather than every GPU looking through every one: a
	// host's thousands of holders on 8 GPUs, every second. A GPU's holders
	// are its notebooks, then its other processes, in the report's order
	// (ranking is stable): as one pass per GPU would list them.
	at := make(map[int][]int, len(r.GPUs)) // GPU index → its places in r.GPUs
	for i := range r.GPUs {
		r.GPUs[i].Holders, r.GPUs[i].HoldersByUser = nil, nil
		at[r.GPUs[i].Index] = append(at[r.GPUs[i].Index], i)
	}
	// each calls f with the place of every GPU per names, and its bytes
	// there: the first entry for an index, as bytesOn reads it, when not 0.
	each := func(per []GPUBytes, f func(i int, b uint64)) {
		for j, pg := range per {
			if pg.Bytes == 0 || slices.ContainsFunc(per[:j], func(q GPUBytes) bool { return q.Index == pg.Index }) {
				continue
			}
			for _, i := range at[pg.Index] {
				f(i, pg.Bytes)
			}
		}
	}
	// Counted first: growing each GPU's list by appends was most of what a
	// sample allocated here.
	counts := make([]int, len(r.GPUs))
	count := func(i int, _ uint64) { counts[i]++ }
	for _, nb := range r.Notebooks {
		each(nb.PerGPU, count)
	}
	for _, o := range r.Other {
		each(o.PerGPU, count)
	}
	byUser := make([]map[string]*Holder, len(r.GPUs))
	for i, n := range counts {
		if n > 0 {
			r.GPUs[i].Holders = make([]Holder, 0, n)
			byUser[i] = map[string]*Holder{}
		}
	}
	user := func(i int, name string) *Holder {
		u, ok := byUser[i][name]
		if !ok {
			u = &Holder{Kind: HolderUser, Name: "user " + name, User: name}
			byUser[i][name] = u
		}
		return u
	}
	for _, nb := range r.Notebooks {
		each(nb.PerGPU, func(i int, b uint64) {
			g := &r.GPUs[i]
			g.Holders = append(g.Holders, Holder{Kind: HolderNotebook, Name: nb.DisplayName, User: nb.User, Bytes: b,
				KernelID: nb.KernelID, ConnectionFile: nb.ConnectionFile})
			u := user(i, holderUser(nb.User))
			u.Bytes += b
			u.Notebooks++
		})
	}
	for _, o := range r.Other {
		name, command := "", ""
		each(o.PerGPU, func(i int, b uint64) {
			if name == "" {
				name, command = "pid "+strconv.Itoa(o.PID)+" ("+o.User+")", cutRunes(o.Command, commandRunes)
			}
			g := &r.GPUs[i]
			g.Holders = append(g.Holders, Holder{Kind: HolderProcess, Name: name, User: o.User, Bytes: b, PID: o.PID, Command: command})
			u := user(i, holderUser(o.User))
			u.Bytes += b
			u.Processes++
		})
	}
	for i := range r.GPUs {
		g := &r.GPUs[i]
		for _, u := range byUser[i] {
			g.HoldersByUser = append(g.HoldersByUser, *u)
		}
		rankHolders(g.Holders)
		rankHolders(g.HoldersByUser)
	}
}

// HoldersFor is GPU g's holders as user sees them on a shared daemon:
// their own notebooks and processes, and every other user as one holder,
// ranked together.
func HoldersFor(g GPU, user string) []Holder {
	var out []Holder
	for _, h := range g.Holders {
		if h.User == user {
			out = append(out, h)
		}
	}
	for _, u := range g.HoldersByUser {
		if u.User != holderUser(user) {
			out = append(out, u)
		}
	}
	rankHolders(out)
	return out
}

// cutRunes keeps the first n runes of s (never a rune cut in two).
func cutRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// UserUsage is one user's GPU memory: what a kernel caller in shared mode
// may learn about other users.
type UserUsage struct {
	User           string `json:"user"`
	Notebooks      int    `json:"notebooks"`
	OtherProcesses int    `json:"other_processes"`
	NotebookBytes  uint64 `json:"notebook_bytes"`
	OtherBytes     uint64 `json:"other_bytes"`
	// GPUMemoryBytes = NotebookBytes + OtherBytes.
	GPUMemoryBytes uint64 `json:"gpu_memory_bytes"`
	// PerGPU sums notebooks and other processes, by GPU index, ascending.
	PerGPU []GPUBytes `json:"per_gpu"`
	// HoardedGiBHours is the GPU memory the user's notebooks held while
	// computing nothing, over the daemon's history window; absent when
	// none of their readings could be judged.
	HoardedGiBHours *float64 `json:"hoarded_gib_hours,omitempty"`
}

// addUsers sets the report's per-user totals.
func addUsers(r *Report, _ FinishInput) {
	r.Users = SummarizeUsers(*r)
	if len(r.Users) == 0 {
		r.Users = nil // a report without users says none (omitted from its JSON)
	}
}

// EveryoneElse totals per user what the report holds beyond kernels (a
// Jupyter server's own, by kernel id), with elsewhere (the totals of users
// whose notebooks the report does not hold: a shared daemon's other
// users), biggest first (ties by name). A process left running for one of
// kernels (a job that outlived its kernel's restart) is that kernel's
// notebook's, shown with it from the report's LeftRunning: not everyone
// else's.
func EveryoneElse(r Report, kernels map[string]bool, elsewhere []UserUsage) []UserUsage {
	rest := Report{Hoarding: r.Hoarding}
	leftFor := map[int]bool{}
	for _, lr := range r.LeftRunning {
		if kernels[lr.KernelID] {
			leftFor[lr.PID] = true
		}
	}
	for _, p := range r.Other {
		if !leftFor[p.PID] {
			rest.Other = append(rest.Other, p)
		}
	}
	for _, nb := range r.Notebooks {
		if !kernels[nb.KernelID] {
			rest.Notebooks = append(rest.Notebooks, nb)
		}
	}
	users := append(SummarizeUsers(rest), elsewhere...)
	slices.SortStableFunc(users, func(a, b UserUsage) int {
		return cmp.Or(cmp.Compare(b.GPUMemoryBytes, a.GPUMemoryBytes), cmp.Compare(a.User, b.User))
	})
	return users
}

// SummarizeUsers totals a report per user, biggest user first (ties by
// name). Notebooks without GPU memory count in Notebooks.
func SummarizeUsers(r Report) []UserUsage {
	byUser := map[string]*UserUsage{}
	perGPU := map[string]map[int]uint64{}
	get := func(user string) *UserUsage {
		u, ok := byUser[user]
		if !ok {
			u = &UserUsage{User: user}
			byUser[user] = u
			perGPU[user] = map[int]uint64{}
		}
		return u
	}
	for _, nb := range r.Notebooks {
		u := get(nb.User)
		u.Notebooks++
		u.NotebookBytes += nb.GPUMemoryBytes
		for _, g := range nb.PerGPU {
			perGPU[nb.User][g.Index] += g.Bytes
		}
	}
	for _, p := range r.Other {
		u := get(p.User)
		u.OtherProcesses++
		for _, g := range p.PerGPU {
			u.OtherBytes += g.Bytes
			perGPU[p.User][g.Index] += g.Bytes
		}
	}
	for _, h := range r.Hoarding {
		if u, ok := byUser[h.User]; ok {
			u.HoardedGiBHours = &h.GiBHours
		}
	}
	users := make([]UserUsage, 0, len(byUser))
	for name, u := range byUser {
		u.GPUMemoryBytes = u.NotebookBytes + u.OtherBytes
		u.PerGPU = []GPUBytes{}
		for idx, b := range perGPU[name] {
			u.PerGPU = append(u.PerGPU, GPUBytes{Index: idx, Bytes: b})
		}
		slices.SortFunc(u.PerGPU, func(a, b GPUBytes) int { return cmp.Compare(a.Index, b.Index) })
		users = append(users, *u)
	}
	slices.SortFunc(users, func(a, b UserUsage) int {
		if c := cmp.Compare(b.GPUMemoryBytes, a.GPUMemoryBytes); c != 0 {
			return c
		}
		return cmp.Compare(a.User, b.User)
	})
	return users
}
