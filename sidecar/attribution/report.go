// Package attribution is pure: it combines GPU processes (from nvml), the
// process table (from procs) and the kernels (from discovery) into
// per-notebook GPU memory. It does no I/O.
package attribution

import "time"

// Report is what `gpumem ls --json` prints and GET /api/v1/notebooks serves.
type Report struct {
	GPUs      []GPU          `json:"gpus"`
	Notebooks []Notebook     `json:"notebooks"`
	Other     []OtherProcess `json:"other"`
	// Warnings are non-fatal problems met while sampling (e.g. no driver).
	Warnings []string `json:"warnings,omitempty"`
	// View is "own" when the report holds only the asking user's notebooks
	// and processes (a user of a shared daemon): the others are in the
	// per-user totals. Empty for the whole report.
	View string `json:"view,omitempty"`
}

// GPU is one physical device with its memory totals. With MIG on, the
// processes of all its instances count towards it.
type GPU struct {
	Index            int    `json:"index"`
	UUID             string `json:"uuid"`
	Name             string `json:"name"`
	MemoryTotalBytes uint64 `json:"memory_total_bytes"`
	MemoryUsedBytes  uint64 `json:"memory_used_bytes"`
	Simulated        bool   `json:"simulated"`
	// Derived: bytes attributed to notebooks, to other processes, and free.
	NotebookBytes uint64 `json:"notebook_bytes"`
	OtherBytes    uint64 `json:"other_bytes"`
	FreeBytes     uint64 `json:"free_bytes"`
}

// GPUBytes is a byte count on one GPU.
type GPUBytes struct {
	Index int    `json:"index"`
	Bytes uint64 `json:"bytes"`
	// BytesUnknown: NVML could not say how much at least one of the
	// processes holds (it reports max uint64); Bytes counts those as 0.
	BytesUnknown bool `json:"bytes_unknown,omitempty"`
}

// Notebook is one kernel and the GPU memory its processes hold.
type Notebook struct {
	KernelID string `json:"kernel_id"`
	// ConnectionFile is the kernel's identity (its id is not: two users'
	// files may share a name); "" where the report's maker has none.
	ConnectionFile string `json:"connection_file,omitempty"`
	Notebook       string `json:"notebook"` // absolute path; "" for a kernel without a server
	PIDs           []int  `json:"pids"`     // kernel pid first, then the tree's processes holding GPU memory
	User           string `json:"user"`
	GPUMemoryBytes uint64 `json:"gpu_memory_bytes"`
	// PeakBytes is the highest GPUMemoryBytes since the kernel process
	// started, as gpumem serve sampled it; absent without the daemon.
	PeakBytes uint64     `json:"peak_bytes,omitempty"`
	PerGPU    []GPUBytes `json:"per_gpu"`
	// Processes breaks GPUMemoryBytes down by process (those holding GPU
	// memory, by pid): what nvidia-smi lists, attributed.
	Processes []ProcessBytes `json:"processes"`
	// Pod is the Kubernetes pod of the kernel; nil off Kubernetes.
	Pod *Pod `json:"pod,omitempty"`
	// Activity is the kernel's server's view of it, when a server lists
	// it; nil otherwise.
	Activity *Activity `json:"activity,omitempty"`
	// StrayContexts are the (GPU, process) pairs of the kernel's tree that
	// hold memory with no framework memory there (FlagStrayContexts).
	StrayContexts []StrayContext `json:"stray_contexts,omitempty"`
	// OOM counts the out-of-memory errors gpumem serve recorded in this
	// kernel; nil when none (or without the daemon).
	OOM *OOMSummary `json:"oom,omitempty"`
}

// OOMSummary is a kernel's out-of-memory errors as the daemon recorded
// them: how many, and the last (its whole event is in the daemon's
// events, by sequence number).
type OOMSummary struct {
	Count              int    `json:"count"`
	LastTime           int64  `json:"last_time"` // unix seconds
	LastGPU            *int   `json:"last_gpu,omitempty"`
	LastRequestedBytes uint64 `json:"last_requested_bytes"`
	LastEvent          uint64 `json:"last_event"`
}

// Activity is what a kernel's Jupyter server says of its activity, and
// what gpumem's culling plans for it.
type Activity struct {
	ExecutionState string    `json:"execution_state"` // idle, busy, starting, ...
	LastActivity   time.Time `json:"last_activity"`
	// IdleSeconds is how long the kernel has been idle (0 while busy).
	IdleSeconds float64 `json:"idle_seconds"`
	// CullAt is when the kernel will be culled unless used (zero when no
	// warning stands); CullAction is what will be done then.
	CullAt     time.Time `json:"cull_at,omitzero"`
	CullAction string    `json:"cull_action,omitempty"`
}

// ProcessBytes is one process's GPU memory.
type ProcessBytes struct {
	PID    int        `json:"pid"`
	PerGPU []GPUBytes `json:"per_gpu"`
}

// OtherProcess is a GPU process that belongs to no kernel.
type OtherProcess struct {
	PID     int        `json:"pid"`
	User    string     `json:"user"`
	Command string     `json:"command"`
	PerGPU  []GPUBytes `json:"per_gpu"`
	// Pod is the Kubernetes pod of the process; nil off Kubernetes.
	Pod *Pod `json:"pod,omitempty"`
}
