package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/oom"
)

// Backend is what the API needs from the daemon: one interface, whatever
// the endpoint. Its methods are called concurrently, one call per request.
type Backend interface {
	// Report is the current snapshot. The server does not modify it.
	Report(ctx context.Context) (attribution.Report, error)
	// KernelOfPID says which kernel's process tree pid belongs to (its
	// connection file), and the uid owning that kernel: a free asked from
	// inside the kernel it frees gets a short deadline.
	KernelOfPID(ctx context.Context, pid int) (connectionFile string, ownerUID uint32, ok bool)
	// Free frees GPU memory in the kernel of k.ConnectionFile; req has been
	// validated, and the caller authorized for that kernel. It returns the
	// JSON reply to send, or an error wrapping ErrKernelNotFound for an
	// unknown kernel. The error's text is sent to the caller: it must not
	// hold a kernel key or a server token.
	Free(ctx context.Context, k KernelRef, req FreeRequest) (json.RawMessage, error)
	// Kernels lists the kernels the daemon follows, as `gpumem kernels`
	// prints them.
	Kernels(ctx context.Context) ([]KernelStatus, error)
	// KernelNow is a kernel's figures sampled now (NVML and /proc), not
	// from the last sample: what a report after a free must show. The
	// error wraps ErrKernelNotFound for an unknown kernel.
	KernelNow(ctx context.Context, k KernelRef) (attribution.Notebook, error)
	// ReportJSON is Report already encoded as JSON (exactly json.Marshal
	// of its value), encoded once per sample: with a thousand kernels the
	// encoding costs milliseconds, and every poll of /api/v1/notebooks (a
	// dashboard, each user's `gpumem ls`) would pay it again. The bytes
	// are shared: the server does not modify them.
	ReportJSON(ctx context.Context) ([]byte, error)

	// History is every series since q.Since (unix seconds), the events
	// after q.EventsAfter, and the current report.
	History(ctx context.Context, q HistoryQuery) (HistoryResponse, error)
	// KernelVars is the %gpumem vars data of the kernel, as JSON;
	// allDevices adds tensors on other devices than GPUs.
	KernelVars(ctx context.Context, k KernelRef, allDevices bool) (json.RawMessage, error)
	// KernelSummary is the %gpumem data (per-framework figures), as JSON.
	KernelSummary(ctx context.Context, k KernelRef) (json.RawMessage, error)
	// KernelWhy asks the kernel for its why data, joins the driver's
	// figures and returns it rendered (text, html).
	KernelWhy(ctx context.Context, k KernelRef, q WhyQuery) (json.RawMessage, error)
	// JoinWhy joins why data the kernel computed itself with the driver's
	// figures; the kernel renders the reply.
	JoinWhy(ctx context.Context, k KernelRef, data json.RawMessage) (json.RawMessage, error)
	// FreeChildren ends the GPU-holding worker processes of a live kernel,
	// never the kernel. fromKernel says the request came from inside the
	// kernel (the caller's process is in its tree), which has run the
	// frameworks' teardown itself. req has been validated: its pids are
	// confirmed for ending whatever they compute, and only them; without
	// pids only the idle workers are ended.
	FreeChildren(ctx context.Context, k KernelRef, fromKernel bool, req FreeChildrenRequest) (json.RawMessage, error)
	// ChildrenBefore reads the driver's figures of the kernel's tree now
	// and keeps them for the FreeChildren from inside the kernel that
	// follows: the kernel runs its teardown between the two, and what the
	// teardown ended is known only from figures read before it.
	ChildrenBefore(ctx context.Context, k KernelRef) (json.RawMessage, error)
	// EndOrphans ends the processes left running of the kernel of
	// k.ConnectionFile (those of req.PIDs, or all) whose recorded owner is
	// user ("": any, for an admin), each checked as reclaim checks (the
	// recorded tree, pid and start time through a pidfd, the user, no live
	// kernel's tree). The error wraps ErrKernelNotFound when none is left
	// running.
	EndOrphans(ctx context.Context, k KernelRef, user string, req EndOrphansRequest) (EndOrphansReply, error)
	// KeepKernel keeps the kernel of k.ConnectionFile from the cull: the
	// keep counts as use. Errors wrap ErrRefused where the daemon culls
	// nothing, ErrKernelNotFound for a kernel it does not follow.
	KeepKernel(ctx context.Context, k KernelRef) (KeepReply, error)
	// RecordOOM records an out-of-memory error of kernel k (the caller is
	// one of its processes) and returns the whole event. Errors wrapping
	// ErrTooMany are answered 429.
	RecordOOM(ctx context.Context, k KernelRef, req oom.Request) (oom.Event, error)
	// OOMEvents is every event recorded and still kept, oldest first.
	OOMEvents(ctx context.Context) ([]oom.Event, error)
	// AddSnapshot takes the snapshot file of kernel k (the caller, of uid,
	// is one of its processes) and starts reducing it.
	AddSnapshot(ctx context.Context, k KernelRef, uid uint32, req SnapshotRequest) (SnapshotInfo, error)
	// Snapshots lists the snapshots of k's connection file, oldest first.
	Snapshots(ctx context.Context, k KernelRef) ([]SnapshotInfo, error)
	// MemorySnapshot is one of them and, once reduced, its reduction's JSON.
	// Errors wrap ErrKernelNotFound for an unknown kernel or snapshot.
	MemorySnapshot(ctx context.Context, k KernelRef, id string) (SnapshotInfo, json.RawMessage, error)
	// SnapshotFile is the raw pickle, to download.
	SnapshotFile(ctx context.Context, k KernelRef, id string) (io.ReadSeeker, SnapshotInfo, error)
}

// ErrNotServed is what a Backend's method answers for what it does not
// serve (a backend that keeps no history, say); the API answers 404.
var ErrNotServed = errors.New("not served by this backend")

// notServed answers 404 with msg when err says the backend does not serve
// the endpoint.
func (s *Server) notServed(w http.ResponseWriter, r *http.Request, err error, msg string) bool {
	if !errors.Is(err, ErrNotServed) {
		return false
	}
	s.writeError(w, r, http.StatusNotFound, msg)
	return true
}

// backendError answers a backend method's error, and says whether there was
// one: 404 with notServedMsg for ErrNotServed, 429 for ErrTooMany, 404 for
// ErrKernelNotFound, 503 for any other (the daemon could not do it now).
func (s *Server) backendError(w http.ResponseWriter, r *http.Request, err error, notServedMsg string) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrNotServed):
		s.writeError(w, r, http.StatusNotFound, notServedMsg)
	case errors.Is(err, ErrTooMany):
		s.writeError(w, r, http.StatusTooManyRequests, err.Error())
	case errors.Is(err, ErrKernelNotFound):
		s.writeError(w, r, http.StatusNotFound, err.Error())
	default:
		s.writeError(w, r, http.StatusServiceUnavailable, err.Error())
	}
	return true
}
