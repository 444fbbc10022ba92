// Package api owns gpumem's local HTTP API: the unix socket the daemon
// serves (creation, permissions, one daemon per socket), the authorization
// of every request from the caller's peer credentials, and the Go client the
// CLI uses. It must not sample GPUs, read /proc or talk to kernels: all of
// that comes through the consumer-side Backend interface.
//
// The API is a security boundary: through POST .../free it runs code in
// kernels. It is served on a unix socket only, never on TCP.
//
// # Endpoints
//
//	GET  /healthz                     {"status":"ok"}
//	GET  /api/v1/gpus                 {"gpus":[attribution.GPU...]}
//	GET  /api/v1/users                {"users":[UserUsage...]}  per-user totals
//	GET  /api/v1/notebooks            attribution.Report (same JSON as `gpumem ls --json`)
//	GET  /api/v1/kernels/{id}         attribution.Notebook of one kernel
//	POST /api/v1/kernels/{id}/free    body: optional FreeRequest; reply: the backend's JSON
//	GET  /api/v1/kernels              {"kernels":[KernelStatus...]}
//	GET  /api/v1/kernels/{id}/vars, /summary  the kernel's %gpumem vars / %gpumem data
//	GET  /api/v1/history              HistoryResponse (history.go)
//	POST /api/v1/oom                  body: oom.Request; reply: oom.Event (oom.go)
//	GET  /api/v1/oom                  {"events":[oom.Event...]}
//	POST /api/v1/snapshots            body: SnapshotRequest; reply 202: SnapshotInfo (snapshots.go)
//	GET  /api/v1/kernels/{id}/snapshots            {"snapshots":[SnapshotInfo...]}
//	GET  /api/v1/kernels/{id}/snapshots/{sid}      SnapshotResponse
//	GET  /api/v1/kernels/{id}/snapshots/{sid}/raw  the pickle
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
//   - a kernel caller is a process that Backend.KernelOfPID places in a
//     kernel's process tree and whose uid is that kernel's owner's uid (the
//     uid check also defeats pid reuse between connect and lookup). It may
//     GET /healthz, /api/v1/gpus and /api/v1/users, GET its own kernel's
//     entry and POST free for its own kernel. Another kernel's id gets 403
//     (whether or not that kernel exists), and so does /api/v1/notebooks;
//   - any other caller may GET /healthz only; everything else is 403.
//
// Per-user totals (GET /api/v1/users) are what a kernel caller may learn about
// other users: for each user, the number of notebooks and of other GPU
// processes, their bytes, and bytes per GPU; never pids, paths or commands.
// An out-of-memory event shows another user's holder by user, bytes and
// idle time only.
//
// # A kernel speaking for itself
//
// POST /api/v1/oom and POST /api/v1/snapshots take no kernel id: the kernel
// is the one whose live process tree holds the caller's SO_PEERCRED pid
// and whose owner is the caller's uid (Backend.KernelOfPID), in either
// mode. No kernel can report for another, and a process of no kernel gets
// 403. A user sees only the events and snapshots of their own kernels.
package api
