// Package examples holds the example notebook and the simulated GPU's
// start-up file of `gpumem demo`, embedded into the binary: a user who
// installed only the wheel has neither file on disk.
package examples

import _ "embed"

// LeaksNotebook is leaks.ipynb: the ways a notebook keeps GPU memory after
// `del`, and what frees each.
//
//go:embed leaks.ipynb
var LeaksNotebook []byte

// SimulatedGPUStartup is simulated_gpu_startup.py, the IPython start-up
// file with which each kernel of the demo's notebook puts its own pid on
// the simulated GPU.
//
//go:embed simulated_gpu_startup.py
var SimulatedGPUStartup []byte
