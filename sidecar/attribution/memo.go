package attribution

import (
	"cmp"
	"slices"
	"strings"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// Memo remembers Attribute's last inputs and report, for a caller that
// attributes once a second what mostly has not changed (the daemon: idle
// notebooks hold the same memory sample after sample, and its
// TreeScanner hands back the same table while no process changed).
// MakeReport is pure: the same GPUs, table and kernels give the same report.
// The zero value is ready; a Memo is not safe for concurrent use.
type Memo struct {
	snap    nvml.Snapshot
	table   *procs.Table
	kernels []Kernel
	report  Report
	valid   bool
}

// Attribute is MakeReport(snap, table, kernels), from memory when the
// inputs equal the last call's (the same table, GPUs and kernels that
// compare equal, the kernels in any order). The report's own slices are
// new at each call (a caller may set its entries' fields); what they
// hold (each notebook's pids, per-GPU figures) is shared with the
// reports before it and must not be changed.
func (m *Memo) Attribute(snap nvml.Snapshot, table *procs.Table, kernels []Kernel) Report {
	sorted := slices.Clone(kernels)
	slices.SortFunc(sorted, func(a, b Kernel) int {
		// The file first, alone: it tells kernels apart but for a file
		// followed twice, and cmp.Or would compare every field each time.
		if c := strings.Compare(a.ConnectionFile, b.ConnectionFile); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.PID, b.PID))
	})
	// Typed comparisons: reflect.DeepEqual of a thousand kernels and the
	// GPUs' process lists was most of what an unchanged sample cost here.
	if !m.valid || table != m.table || !slices.Equal(sorted, m.kernels) || !snap.Equal(m.snap) {
		m.snap, m.table, m.kernels = snap, table, sorted
		m.report, m.valid = MakeReport(snap, table, kernels), true
	}
	rep := m.report
	rep.GPUs = slices.Clone(rep.GPUs)
	rep.Notebooks = slices.Clone(rep.Notebooks)
	rep.Other = slices.Clone(rep.Other)
	rep.Warnings = slices.Clone(rep.Warnings)
	return rep
}
