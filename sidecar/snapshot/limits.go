package snapshot

import (
	"context"
	"errors"
	"fmt"
)

// The bounds of one reduction. A snapshot is a user's file: whatever it
// holds, reading it costs the daemon at most Limits.Bytes of memory (an
// estimate of what the decoder and the reducer hold, checked at every
// opcode and every table the reducer grows) and CPU time linear in its
// size (the reducer's steps are counted against what was read), and it
// stops within a few milliseconds of its context's end.

// Limits bound what a pickle may make the reader hold and do: a hostile
// file gets an error that wraps ErrLimit, never the daemon's memory or a
// core for long.
type Limits struct {
	// Bytes bounds the memory the decoder and reducer hold at once, as
	// estimated: 24 bytes a value slot (stack, memo, container item), a
	// string's length, the reducer's tables by their entries.
	Bytes int64
	Stack int // values on the stack
	Depth int // nested marks
	// MemoSlots bounds the memo. Its indexes must come in order (as
	// CPython's pickler writes them): a slot is never allocated before
	// every slot below it was stored.
	MemoSlots int
	// WorkPerByte is how many reducer steps (a key compared, an item or
	// block visited, a frame rendered) each byte read allows, on top of
	// WorkBase: a honest snapshot takes under one a byte; a pickle that
	// makes the reducer visit the same huge dict or list again and again
	// through the memo runs out.
	WorkPerByte, WorkBase int64
	// CheckEvery is how many opcodes or steps pass between looks at the
	// context.
	CheckEvery int64
}

// DefaultLimits suit a snapshot of a million trace entries and more
// (which the reducer consumes as they are read; the memo's slots, 2 an
// entry, are most of what stays: 900,000 entries are estimated at 36
// MiB) within 64 MiB.
var DefaultLimits = Limits{Bytes: 64 << 20, Stack: 1 << 18, Depth: 256, MemoSlots: 1 << 22,
	WorkPerByte: 16, WorkBase: 1 << 24, CheckEvery: 1 << 12}

// ErrLimit is wrapped by a reader's error when a pickle passes a Limit.
var ErrLimit = errors.New("over the reader's limits")

// Per-value costs in the memory estimate: an interface slot and what it
// boxes; a dict's or list's own header.
const (
	slotCost     = 24
	memoSlotCost = 16 // the memo holds pointers (containers, strings) in its slots: none boxed
	dictCost     = 64
	listCost     = 40
)

// meter counts what one reduction holds and does, and looks at its
// context now and then.
type meter struct {
	ctx    context.Context
	limits Limits
	held   int64 // estimated bytes, the stack and memo aside (cost adds them)
	peak   int64 // the most cost was at an opcode's end
	work   int64
	checks int64 // steps until the next look at ctx
	read   func() int64
}

func newMeter(ctx context.Context, limits Limits, read func() int64) *meter {
	if limits.CheckEvery <= 0 {
		limits.CheckEvery = 1 << 12
	}
	return &meter{ctx: ctx, limits: limits, read: read, checks: limits.CheckEvery}
}

// alloc adds n bytes to what is held; past Limits.Bytes it is an error.
func (m *meter) alloc(n int64, what string) error {
	m.held += n
	if m.held > m.limits.Bytes {
		return m.overBytes(what)
	}
	return nil
}

func (m *meter) overBytes(what string) error {
	return fmt.Errorf("%s: the reader would hold more than %d MiB (its memory bound): %w", what, m.limits.Bytes>>20, ErrLimit)
}

func (m *meter) free(n int64) { m.held -= n }

// step counts n steps of work: past the allowance for the bytes read so
// far it is an error, and every CheckEvery steps ctx is looked at.
func (m *meter) step(n int64) error {
	m.work += n
	if m.checks -= n; m.checks > 0 {
		return nil
	}
	m.checks = m.limits.CheckEvery
	if err := m.ctx.Err(); err != nil {
		return fmt.Errorf("reduction stopped: %w", context.Cause(m.ctx))
	}
	if allowed := m.limits.WorkBase + m.limits.WorkPerByte*m.read(); m.work > allowed {
		return fmt.Errorf("%d steps for %d bytes read: the reducer visits the same values again and again (its CPU bound "+
			"is %d steps a byte); torch never writes such a snapshot: %w", m.work, m.read(), m.limits.WorkPerByte, ErrLimit)
	}
	return nil
}

// count adds n steps of work that cannot fail here: the next step looks.
func (m *meter) count(n int64) {
	m.work += n
	m.checks -= n
}
