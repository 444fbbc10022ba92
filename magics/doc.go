// Package magics owns the %gpumem magics: the Python that gpumem injects
// into running IPython kernels (the package py/gpumem_magics, one module per
// job, and py/bootstrap.py, embedded with go:embed) and the Go that injects
// it (Inject), runs a free through it (FreeCache, for `gpumem free KERNEL`)
// and asks whether it is there (GetStatus). InjectCell hands Inject's cell
// to a program that drives a kernel its own way (the GPU host's check).
//
// Every request is one silent execute of the bootstrap carrying the whole
// package, compressed; the bootstrap installs it from memory as
// sys.modules["_gpumem_magics"]. What the injected code promises the
// kernel's user is written in py/gpumem_magics/__init__.py: no framework
// imported, no CUDA context created, nothing added to the user's namespace,
// execution_count, In/Out, history, last_execution_result and sys.last_*
// left as they were (its hygiene module, the one place that restores
// them), idempotent.
//
// It talks to kernels only through the consumer-side Executor interface
// (which *protocol.Client satisfies); it opens no sockets, starts no
// goroutines and does not log. Every request goes to the shell channel, so
// it runs after the kernel's current cell, never in the middle of one.
//
// Rendering happens in the kernel, in Python, from a data dict
// (py/gpumem_magics/render.py): the magics display it, and FreeCache
// returns its text and HTML in FreeReport. A kernel runs its user's code,
// so what it renders is its user's word: FreeCache makes it safe to show
// and keeps the driver's figures out of it; FreeReport.Render marks the
// kernel's text as the kernel's and adds the figures read in Go. The golden
// tests feed fixed data dicts to that Python; py/tests holds the pytest
// tests of the pure modules.
package magics
