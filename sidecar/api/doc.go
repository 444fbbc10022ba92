// Package api owns gpumem's local HTTP API: the unix socket the daemon
// serves (creation, permissions, one daemon per socket), the authorization
// of every request from the caller's peer credentials, and the Go client the
// CLI uses. It must not sample GPUs, read /proc or talk to kernels: all of
// that comes through the consumer-side Backend interface, one for every
// endpoint (a method a backend does not serve answers ErrNotServed: 404).
//
// The API is a security boundary: through POST .../free it runs code in
// kernels. It is served on a unix socket only, never on TCP.
//
// # Endpoints
//
//	GET  /healthz                     {"status":"ok"}
//	GET  /api/v1/gpus                 {"gpus":[attribution.GPU...]}
//	GET  /api/v1/users                {"users":[UserUsage...]}  per-user totals
//	GET  /api/v1/notebooks            attribution.Report, finished (same JSON as `gpumem ls --json`)
//	GET  /api/v1/history              HistoryResponse (?since=&events_after=&wait=1&kernels=ID,...)
//	GET  /api/v1/kernels              {"kernels":[KernelStatus...]}
//	GET  /api/v1/kernels/{id}         attribution.Notebook of one kernel (?fresh=1: read now)
//	POST /api/v1/kernels/{id}/free    body: optional FreeRequest; reply: the backend's JSON
//	GET  /api/v1/kernels/{id}/vars    the kernel's %gpumem vars data (?all_devices=1)
//	GET  /api/v1/kernels/{id}/summary the kernel's %gpumem data
//	GET  /api/v1/kernels/{id}/why     %gpumem why joined with the driver's figures (?device=&all_devices=1&budget=)
//	POST /api/v1/kernels/{id}/why     body: a kernel's own why data; reply: it joined
//	POST /api/v1/kernels/{id}/children/before  from the kernel's own cell: read its tree's figures before its teardown
//	POST /api/v1/kernels/{id}/children/free  body: optional FreeChildrenRequest; end the kernel's idle GPU-holding workers (or the confirmed pids), never the kernel
//	POST /api/v1/kernels/{id}/orphans/end    body: optional EndOrphansRequest; end processes reclaim left running
//	POST /api/v1/kernels/{id}/keep    keep it from the cull ("Keep it"): counts as use; reply: KeepReply
//	POST /api/v1/oom                  body: oom.Request; reply: oom.Event (oom.go)
//	GET  /api/v1/oom                  {"events":[oom.Event...]}
//	POST /api/v1/snapshots            body: SnapshotRequest; reply 202: SnapshotInfo (snapshots.go)
//	GET  /api/v1/kernels/{id}/snapshots            {"snapshots":[SnapshotInfo...]}
//	GET  /api/v1/kernels/{id}/snapshots/{sid}      SnapshotResponse
//	GET  /api/v1/kernels/{id}/snapshots/{sid}/raw  the pickle
//
// The routes are one table (routes.go); a test keeps this list equal to it.
// The report is finished (attribution.Finish): its GPUs' holders, per-user
// totals and alerts with their text are the daemon's; history's kernels=
// (a Jupyter server's kernels) adds "others", everything else the caller
// may see, totalled per user.
//
// Every endpoint of one kernel (/api/v1/kernels/{id}/...) takes
// ?connection_file=PATH to choose among kernels sharing an id.
//
// GET endpoints also answer HEAD. Any other method on these paths gets 405;
// any other path 404. Errors are JSON: {"error":"..."}.
//
// # Browser requests
//
// A browser cannot open a unix socket, but a local proxy (socat,
// jupyter-server-proxy) could forward one. Every request carrying an Origin,
// Referer, Sec-Fetch-Site or Sec-Fetch-Mode header, or a Host other than "",
// "localhost" or SocketHost, is refused with 403 before anything else.
//
// # Authorization
//
// The caller's uid and pid come from SO_PEERCRED, taken by the kernel when
// the caller connected; a connection whose credentials cannot be read gets
// 403 on every request.
//
// Private mode (the default): the socket file is 0600, so only the daemon's
// user and root can connect. The server checks again: a caller whose uid is
// neither the daemon's effective uid nor 0 gets 403 (should the file mode
// ever be loosened by hand). Admitted callers may do everything.
//
// Shared mode (--socket-mode shared): the socket file is 0666 and
//
//   - root (uid 0) and the daemon's own uid are admins: they may do everything;
//   - every other local user is a user (named as the report names kernels'
//     owners): GET /healthz, /api/v1/gpus and /api/v1/users; their own view
//     of /api/v1/notebooks, /api/v1/kernels and /api/v1/history; and the
//     endpoints of one kernel for their own kernels only.
//
// # Which kernel an {id} names
//
// A kernel id is no identity: it is public (every kernel's argv), and anyone
// may name a connection file after another's kernel. A kernel is its
// connection file, and its owner the user of its proven process, as the last
// report says. The endpoints of one kernel pick, among the report's kernels
// of that id (and of that file, with ?connection_file=PATH), those the
// caller may act on: a user's own, or all for an admin. None: 403 for a user
// (the same whether or not another user's kernel has that id; the request
// never reaches another user's kernel, so no refusal of theirs is seen), 404
// for an admin. More than one: 409, naming only the candidates the caller
// may see and how to choose one.
//
// Per-user totals (GET /api/v1/users) are what a user may learn about
// other users: for each user, the number of notebooks and of other GPU
// processes, their bytes, and bytes per GPU; never pids, paths or commands.
// An out-of-memory event shows another user's holder by user, bytes and
// idle time only.
//
// # A kernel speaking for itself
//
// POST /api/v1/oom and POST /api/v1/snapshots take no kernel id: the kernel
// is the one whose live process tree holds the caller's SO_PEERCRED pid
// and whose owner is the caller's uid (Backend.KernelOfPID: its connection
// file, the kernel's identity), in either mode. No kernel can report for
// another; a process of no kernel gets 403, one of a kernel the last
// sample does not have yet 404. A caller whose uid owns no kernel of the
// last sample is refused from its credentials alone, before anything of
// /proc is read; the proof itself reads the caller's ancestry (a stat per
// generation), never all of /proc. A user sees only the events and
// snapshots of their own kernels, a kernel's snapshots being those of its
// file.
//
// # Bounds
//
// In shared mode every local user may call a daemon that runs as root, so
// what one caller may make it spend is bounded (limits.go): each uid may
// have 16 requests in flight (admins 64), and one more gets 429 with
// Retry-After, before its body is read; another uid keeps its own share.
// Every body is bounded by what its clients send (413 past it: a why body
// 256 KiB, a free 64 KiB, an out-of-memory report oom.MaxRequestBody, a
// snapshot 8 KiB). Refused and failed requests are logged at most 5 a
// minute per uid, then counted, and the count logged; a line holds only a
// capped, escaped prefix of what the caller sent.
package api
