// Package attribution is pure: it combines GPU processes (from nvml), the
// process table (from procs) and the kernels (from discovery) into
// per-notebook GPU memory, and finishes that report once (Finish: each
// notebook's display name, pods, activity, who holds each GPU, per-user
// totals, each GPU's level, alerts and their text) for every face to
// render. It does no I/O.
//
// # The report's schema
//
// The finished report's JSON is a contract between the daemon and the
// faces written in other languages (the magics and the server extension
// in Python, JupyterLab in TypeScript): Report.Schema carries
// ReportSchema, which Finish sets. A breaking change bumps it: a field
// renamed or removed, or a field's meaning or unit changed. Adding a
// field does not (readers ignore what they do not know). The golden
// report (testdata/report/golden-report.json at the repository's root,
// TestGoldenReport) is what the other languages' tests read: a change of
// the shape shows there first.
package attribution

import "time"

// ReportSchema is the version of the report's JSON (Report.Schema): see
// the package doc for what bumps it.
const ReportSchema = 1

// Report is what `gpumem ls --json` prints and GET /api/v1/notebooks serves.
type Report struct {
	// Schema is ReportSchema when Finish finished the report; 0 for one
	// that was never finished (a daemon older than the field).
	Schema    int            `json:"schema,omitempty"`
	GPUs      []GPU          `json:"gpus"`
	Notebooks []Notebook     `json:"notebooks"`
	Other     []OtherProcess `json:"other"`
	// Warnings are non-fatal problems met while sampling (e.g. no driver).
	Warnings []string `json:"warnings,omitempty"`
	// View is "own" when the report holds only the asking user's notebooks
	// and processes (a user of a shared daemon): the others are in the
	// per-user totals. Empty for the whole report.
	View string `json:"view,omitempty"`
	// LeftRunning are processes of dead kernels' trees that reclaim left
	// running because they computed on a GPU (or could not be judged):
	// gpumem serve's, absent without it.
	LeftRunning []LeftRunning `json:"left_running,omitempty"`
	// Hoarding is, per user, the GPU memory their notebooks held while
	// computing nothing, over the daemon's history window; absent without
	// gpumem serve.
	Hoarding []UserHoarding `json:"hoarding,omitempty"`
	// Users totals the report per user, biggest first (Finish).
	Users []UserUsage `json:"users,omitempty"`
	// Alerts are the alerts that stand, with their text (Finish).
	Alerts []Alert `json:"alerts,omitempty"`
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
	// Level is how full the GPU is, for a face's colour (Finish:
	// LevelFor): LevelOK, LevelWarn or LevelDanger.
	Level string `json:"level"`
	// UnderThreshold is the sentence a face shows when the GPU's threshold
	// alert no longer stands: set while the GPU is under the threshold
	// after it has crossed it at least once (Finish); "" otherwise.
	UnderThreshold string `json:"under_threshold,omitempty"`
	// Derived: bytes attributed to notebooks, to other processes, and free.
	NotebookBytes uint64 `json:"notebook_bytes"`
	OtherBytes    uint64 `json:"other_bytes"`
	FreeBytes     uint64 `json:"free_bytes"`
	// Utilization sums the GPU's processes' (at most 100 each); nil when
	// the GPU cannot say, and UtilizationMissing says why.
	Utilization        *Utilization `json:"utilization,omitempty"`
	UtilizationMissing string       `json:"utilization_missing,omitempty"`
	// Holders are the notebooks and other processes holding memory on the
	// GPU, biggest first; HoldersByUser the same by user (Finish).
	Holders       []Holder `json:"holders,omitempty"`
	HoldersByUser []Holder `json:"holders_by_user,omitempty"`
}

// GPUBytes is a byte count on one GPU.
type GPUBytes struct {
	Index int    `json:"index"`
	Bytes uint64 `json:"bytes"`
	// BytesUnknown: NVML could not say how much at least one of the
	// processes holds (it reports max uint64); Bytes counts those as 0.
	BytesUnknown bool `json:"bytes_unknown,omitempty"`
	// Utilization is the share of this GPU the process (or the notebook's
	// processes together) used just now; nil when unknown, never 0 for
	// unknown.
	Utilization *Utilization `json:"utilization,omitempty"`
}

// Utilization is a share of GPU time, as NVML's per-process utilization
// says: the percentage of the last moments in which a kernel ran on the
// GPU's SMs, and in which device memory was read or written. Summed over
// processes it is at most 100 a GPU; a notebook's figure sums its GPUs,
// like top's CPU percentage (200 = two GPUs busy).
type Utilization struct {
	SMPercent     uint32 `json:"sm_percent"`
	MemoryPercent uint32 `json:"memory_percent"`
}

// Notebook is one kernel and the GPU memory its processes hold.
type Notebook struct {
	KernelID string `json:"kernel_id"`
	// ConnectionFile is the kernel's identity (its id is not: two users'
	// files may share a name); "" where the report's maker has none.
	ConnectionFile string `json:"connection_file,omitempty"`
	Notebook       string `json:"notebook"` // absolute path; "" for a kernel without a server
	// DisplayName is the name every face shows for the notebook: its
	// path's file name, else "kernel " and its id's first 8 characters
	// (Finish: KernelName).
	DisplayName    string `json:"display_name"`
	PIDs           []int  `json:"pids"` // kernel pid first, then the tree's processes holding GPU memory
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
	// Utilization sums the notebook's processes over its GPUs; nil when
	// unknown (a GPU that cannot say, MIG, no driver).
	Utilization *Utilization `json:"utilization,omitempty"`
	// Compute is gpumem serve's verdict on whether the notebook's
	// processes compute on a GPU, and what they held while not; nil
	// without the daemon.
	Compute *Compute `json:"compute,omitempty"`
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
	// LastHeadline is the last event's one line (the OOM alert's text).
	LastHeadline string `json:"last_headline,omitempty"`
}

// Compute states.
const (
	ComputeComputing = "computing"
	ComputeIdle      = "idle"
	ComputeUnknown   = "unknown"
)

// Compute is whether a notebook's processes computed on a GPU within the
// daemon's compute window (a threshold over the window, see gpumem serve
// --compute-window).
type Compute struct {
	State string `json:"state"` // ComputeComputing, ComputeIdle or ComputeUnknown
	// Reason says, for people, what the state rests on.
	Reason string `json:"reason,omitempty"`
	// LastComputedAt is the newest reading in which one of its processes
	// computed, since the daemon started (zero: none seen).
	LastComputedAt time.Time `json:"last_computed_at,omitzero"`
	// HoardedGiBHours is the GPU memory the kernel held while computing
	// nothing (state idle), over the history window, in GiB·hours; nil
	// when no reading of the window could be judged.
	HoardedGiBHours *float64 `json:"hoarded_gib_hours,omitempty"`
}

// UserHoarding is one user's GPU memory held while computing nothing,
// over the history window, every notebook of theirs counted (those gone
// since too).
type UserHoarding struct {
	User          string  `json:"user"`
	GiBHours      float64 `json:"gib_hours"`
	WindowSeconds int64   `json:"window_seconds"`
}

// LeftRunning is a process of a dead kernel's tree that reclaim did not
// end because it was computing on a GPU, or because its utilization was
// unknown. Only its user (or root) may end it, explicitly.
type LeftRunning struct {
	KernelID string `json:"kernel_id"`
	// ConnectionFile is the dead kernel's identity (an id may name
	// several kernels); User is the process's owner, as recorded.
	ConnectionFile string    `json:"connection_file"`
	Notebook       string    `json:"notebook"`
	User           string    `json:"user"`
	PID            int       `json:"pid"`
	StartTime      uint64    `json:"start_time"` // /proc/<pid>/stat field 22: with the pid, the process
	Command        string    `json:"command"`
	GPUs           []int     `json:"gpus"`
	Bytes          uint64    `json:"bytes"`
	Reason         string    `json:"reason"` // ComputeComputing or ComputeUnknown
	Since          time.Time `json:"since"`
	// Message is the sentence every face shows.
	Message string `json:"message"`
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
