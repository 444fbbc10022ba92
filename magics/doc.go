// Package magics owns the %gpumem magics: the Python that gpumem injects
// into running IPython kernels (gpumem_magics.py and bootstrap.py, embedded
// with go:embed), the Go that injects it (Inject), runs a free through it
// (FreeCache, for `gpumem free KERNEL`) and renders FreeReport for the CLI.
//
// What the injected code promises the kernel's user is written at the top of
// gpumem_magics.py: no framework imported, no CUDA context created, nothing
// added to the user's namespace, execution_count, In/Out, history,
// last_execution_result and sys.last_* left as they were, idempotent.
//
// It talks to kernels only through the consumer-side Executor interface
// (which *protocol.Client satisfies); it opens no sockets, starts no
// goroutines and does not log. Every request goes to the shell channel, so
// it runs after the kernel's current cell, never in the middle of one.
//
// Rendering: the magics' HTML and text are made in the kernel by Python from
// a data dict (render() in gpumem_magics.py), since the kernel has no Go to
// call; the golden tests feed fixed data dicts to that Python. FreeReport's
// text for the CLI is rendered here, in Go, from the same "free" dict.
package magics
