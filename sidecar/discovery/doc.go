// Package discovery finds the Jupyter kernels running on this machine and the
// notebook each one serves.
//
// Kernels come from connection files (kernel-*.json) in Jupyter runtime dirs;
// servers from jpserver-*.json (jupyter_server) and nbserver-*.json
// (Notebook 6); notebook paths from each server's GET /api/sessions, made
// absolute against the server's root dir; each kernel's OS process from the
// process that owns the kernel's listening shell port (confirmed against
// argv naming the connection file).
//
// Discovery never talks to a kernel over ZeroMQ: that is the caller's choice
// (it counts as activity for Jupyter's idle culler).
package discovery
