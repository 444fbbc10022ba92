"""gpumem's %gpumem magics, injected into a running IPython kernel.

gpumem sends this package over the Jupyter protocol as one silent execute
(see magics/boot.go and bootstrap.py); nothing is installed in the user's
environment and no file is written. The bootstrap registers it as
sys.modules["_gpumem_magics"], its modules as attributes of it only; they
import each other at the top, never inside a function, since later
imports would not find them in sys.modules.

Rules this code keeps, because it runs inside someone else's notebook:
  - it never imports torch, tensorflow, jax or cupy: it only uses the ones
    already in sys.modules;
  - it never creates a CUDA context: every call that would initialise CUDA
    is guarded (torch.cuda.is_initialized(), JAX's backends, TF's context);
  - it adds nothing to the user's namespace: its state lives in its modules;
  - it never raises into the user's cell and leaves execution_count,
    In/Out, history, last_execution_result and sys.last_* as they were
    (hygiene.py);
  - it renders only from a data dict (render.py), so the renderings are
    deterministic and tested with golden files.

The modules, one job each:
  - state: the shell, gpumem's config, the version; small shared helpers.
  - hygiene: leaves the kernel's state as it was around gpumem's code.
  - units, layout, render: bytes, text and HTML (pure).
  - probes: what each framework holds, per device.
  - holders: which variables and IPython references hold that memory.
  - why, why_elsewhere, why_allocator, referrers, referrers_steps,
    fixes, frozen, allocator, workers, whymagic, render_why: %gpumem why
    (every byte in one row: who holds it, through which chain of
    references, and its fix) and %gpumem free --children.
  - freeing: %gpumem free and `gpumem free`.
  - reports: the data of %gpumem, %gpumem vars and %%gpumem.
  - daemon: talking to gpumem serve's API (driver figure, %gpumem top).
  - alerts: the pre_run_cell hook that prints gpumem serve's alerts.
  - magic: the %gpumem entry points and what the bootstrap calls.

The data dicts are gpumem's JSON schema v1; magics/free.go decodes the
"free" one for `gpumem free`.
"""
