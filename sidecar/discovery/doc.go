// Package discovery finds the Jupyter kernels running on this machine and the
// notebook each one serves.
//
// Kernels come from connection files (kernel-*.json) in Jupyter runtime dirs,
// and from the files processes were launched with elsewhere (nbclient,
// papermill and scripts use /tmp/tmpXXXX.json), those listed only when their
// process is proven; servers from jpserver-*.json (jupyter_server, over TCP
// or a unix socket) and nbserver-*.json (Notebook 6); notebook paths from
// each server's GET /api/sessions, made absolute against the server's root
// dir, else from what a proven kernel process itself says (an absolute
// JPY_SESSION_NAME, papermill's input); each kernel's OS process from the
// process that owns the kernel's listening shell port (confirmed against
// argv naming the connection file). A server whose file holds no usable
// token is not asked unless GPUMEM_SERVER_TOKEN gives one for its URL.
//
// Files are their users' to write, so none is trusted for more than its
// owner: no link is followed to a file, a file in a user's dir must be that
// user's, a server file names only the kernels of its own dir and owner,
// and is asked only through a listener of its owner on this host. Kernels
// are known by their connection file: a kernel id is public, and anyone may
// name a file after someone else's.
//
// Discovery never talks to a kernel over ZeroMQ: that is the caller's choice
// (it counts as activity for Jupyter's idle culler).
package discovery
