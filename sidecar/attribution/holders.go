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

// bytesOn is the bytes of per on GPU index, and whether per names it.
func bytesOn(per []GPUBytes, index int) (uint64, bool) {
	for _, pg := range per {
		if pg.Index == index {
			return pg.Bytes, true
		}
	}
	return 0, false
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
