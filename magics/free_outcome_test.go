package magics

import "testing"

// The free's one line says what went back to the GPU, and a free that
// moved nothing says so: never "freed" for an unchanged figure.
func TestFreeOutcome(t *testing.T) {
	gib := uint64(1 << 30)
	held := func(b uint64) *uint64 { return &b }
	torch := func(before, after uint64) FrameworkFree {
		return FrameworkFree{Name: "torch", Label: "PyTorch", Device: "cuda:0",
			Before: MemoryUsage{Held: held(before)}, After: MemoryUsage{Held: held(after)}}
	}
	for _, tc := range []struct {
		name     string
		rep      FreeReport
		returned bool
		summary  string
	}{
		{"driver figure fell", FreeReport{Driver: &DriverDelta{Before: 3 * gib, After: gib / 2}}, true,
			"returned 2.5 GiB to the GPU (the driver's figure for the kernel: 3.0 GiB → 512.0 MiB)"},
		{"driver figure unchanged", FreeReport{Driver: &DriverDelta{Before: 3 * gib, After: 3 * gib}, Frameworks: []FrameworkFree{torch(gib, 0)}}, false,
			"returned nothing to the GPU: the driver still counts 3.0 GiB for the kernel (in use, or its CUDA context)"},
		{"driver figure grew", FreeReport{Driver: &DriverDelta{Before: gib, After: 2 * gib}}, false,
			"returned nothing to the GPU: the driver still counts 2.0 GiB for the kernel (in use, or its CUDA context)"},
		{"no GPU memory at all", FreeReport{Driver: &DriverDelta{}}, false, "returned nothing: the kernel holds no GPU memory"},
		{"caches without the driver", FreeReport{Frameworks: []FrameworkFree{torch(258<<20, 0), torch(0, 0)}}, true,
			"returned 258.0 MiB of cached memory to the GPU"},
		{"empty caches", FreeReport{Frameworks: []FrameworkFree{torch(gib, gib)}}, false,
			"returned nothing to the GPU: no framework held cached memory"},
		{"TensorFlow cannot tell", FreeReport{Frameworks: []FrameworkFree{{Name: "tensorflow", Label: "TensorFlow"}}}, false,
			"the frameworks cannot say what they returned (TensorFlow keeps its memory until the kernel exits)"},
		{"no framework", FreeReport{}, false, "returned nothing: no framework holds GPU memory in this kernel"},
		{"dry run", FreeReport{DryRun: true, Driver: &DriverDelta{Before: 3 * gib, After: gib}}, false, "dry run: nothing was freed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.rep.withOutcome()
			if got.Returned != tc.returned || got.Summary != tc.summary {
				t.Errorf("returned %v, summary %q\nwant %v, %q", got.Returned, got.Summary, tc.returned, tc.summary)
			}
		})
	}
}
