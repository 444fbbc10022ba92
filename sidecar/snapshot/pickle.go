package snapshot

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The pickle reader: the data opcodes of protocols 2 to 5 (what CPython's
// pickle.dump writes for dicts, lists, tuples, strings, bytes, numbers,
// booleans and None), read as a stream. It never resolves a class or calls
// anything: an opcode that would (GLOBAL, REDUCE, BUILD, ...) is an error.
// Why not a general pickle library: both well-kept Go ones build the whole
// object graph, which for a 900,000-entry snapshot took 3 to 10 s and
// about 17 times the file's size in memory here (BENCHMARKS.md); this one
// hands each trace entry to the reducer as it is read and forgets it.

// List is a pickled list. Items is nil for a list whose items a
// decoder's OnAppend consumed.
type List struct {
	Items    []any
	memo     int  // memo slot holding the list, -1 if none
	replaced bool // consumed: Replace put a value of the reducer's in its slot
}

// Dict is a pickled dict, its keys in order.
type Dict struct {
	Keys, Vals []any
	memo       int
	// tag is the reducer's own mark (a frame dict's id + 1), so that a
	// frame met again costs no lookup.
	tag      int32
	consumed bool // Forget emptied it
}

// Get returns the value of string key k.
func (d *Dict) Get(k string) (any, bool) {
	i := d.index(k)
	if i < 0 {
		return nil, false
	}
	return d.Vals[i], true
}

// index is the position of string key k, -1 if none.
func (d *Dict) index(k string) int {
	for i, key := range d.Keys {
		if s, ok := key.(string); ok && s == k {
			return i
		}
	}
	return -1
}

// Tuple is a pickled tuple.
type Tuple []any

// forgotten marks a memo slot whose value was consumed; reading it again is
// an error (the snapshots gpumem reads never do).
type forgotten struct{}

// Decoder reads one pickle.
type Decoder struct {
	r     *bufio.Reader
	off   int64
	m     *meter
	stack []any
	marks []int
	memo  []any
	buf   []byte
	// OnAppend is offered the items about to be appended to l (APPEND,
	// APPENDS); when it returns true they are not appended, and it may
	// Forget them. An error it returns ends the decoding.
	OnAppend func(l *List, items []any) (bool, error)
}

// NewDecoder reads from r within limits.
func NewDecoder(r io.Reader, limits Limits) *Decoder {
	d := &Decoder{r: bufio.NewReaderSize(r, 1<<16), buf: make([]byte, 256)}
	d.m = newMeter(context.Background(), limits, d.Offset)
	return d
}

// Offset is how many bytes were read.
func (d *Decoder) Offset() int64 { return d.off }

// cost is the estimate of what the decoder and its reducer hold.
func (d *Decoder) cost() int64 {
	return d.m.held + slotCost*int64(cap(d.stack)) + memoSlotCost*int64(cap(d.memo)) + 8*int64(cap(d.marks))
}

// Forget empties dict (read by this decoder, and consumed) and drops it
// from the memo: its memory goes even if the pickle refers to it again
// (it then reads as an empty dict).
func (d *Decoder) Forget(dict *Dict) {
	if dict.consumed {
		return
	}
	dict.consumed = true
	if dict.memo >= 0 && dict.memo < len(d.memo) {
		d.memo[dict.memo] = forgotten{}
	}
	d.m.free(dictCost + slotCost*int64(cap(dict.Keys)+cap(dict.Vals)))
	dict.Keys, dict.Vals = nil, nil
}

// Replace puts v in the memo slot of l, which was consumed, and drops l's
// items: a later reference to l reads v.
func (d *Decoder) Replace(l *List, v any) {
	if l.replaced {
		return
	}
	l.replaced = true
	if l.memo >= 0 && l.memo < len(d.memo) {
		d.memo[l.memo] = v
	}
	d.m.free(listCost + slotCost*int64(cap(l.Items)))
	l.Items = nil
}

// memoValue is what l's memo slot holds now (nil if none).
func (d *Decoder) memoValue(l *List) any {
	if l.memo >= 0 && l.memo < len(d.memo) {
		return d.memo[l.memo]
	}
	return nil
}

// Pickle opcodes (Lib/pickletools.py).
const (
	opMark           = '('
	opStop           = '.'
	opPop            = '0'
	opPopMark        = '1'
	opDup            = '2'
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opBinInt2        = 'M'
	opNone           = 'N'
	opBinUnicode     = 'X'
	opAppend         = 'a'
	opBinBytes       = 'B'
	opShortBinBytes  = 'C'
	opDict           = 'd'
	opEmptyDict      = '}'
	opAppends        = 'e'
	opBinGet         = 'h'
	opLongBinGet     = 'j'
	opList           = 'l'
	opEmptyList      = ']'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opSetItem        = 's'
	opTuple          = 't'
	opEmptyTuple     = ')'
	opSetItems       = 'u'
	opBinFloat       = 'G'
	opProto          = 0x80
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opLong1          = 0x8a
	opLong4          = 0x8b
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opBinBytes8      = 0x8e
	opMemoize        = 0x94
	opFrame          = 0x95
	opShortBinString = 'U'
)

// maxString bounds one string or bytes value: a snapshot's are file
// names, function names and a few words.
const maxString = 1 << 20

// Decode reads the pickle's one value; it stops when ctx ends.
func (d *Decoder) Decode(ctx context.Context) (any, error) {
	d.m.ctx = ctx
	for {
		at := d.off
		op, err := d.byte()
		if err != nil {
			return nil, d.eof(err)
		}
		err = d.m.step(1)
		if err == nil {
			err = d.step(op)
		}
		if err == nil {
			err = d.bounded()
		}
		if err != nil {
			if errors.Is(err, errStop) {
				if len(d.stack) != 1 || len(d.marks) != 0 {
					return nil, fmt.Errorf("pickle: STOP at byte %d with %d values and %d marks on the stack", at, len(d.stack), len(d.marks))
				}
				return d.stack[0], nil
			}
			return nil, fmt.Errorf("pickle: opcode 0x%02x at byte %d: %w", op, at, err)
		}
	}
}

// bounded checks the stack's height and the memory estimate after an
// opcode (each grows them by a bounded amount, a string's length aside,
// which is checked before it is read).
func (d *Decoder) bounded() error {
	if len(d.stack) > d.m.limits.Stack {
		return fmt.Errorf("more than %d values on the stack: %w", d.m.limits.Stack, ErrLimit)
	}
	c := d.cost()
	d.m.peak = max(d.m.peak, c)
	if c > d.m.limits.Bytes {
		return d.m.overBytes("the values read")
	}
	return nil
}

var errStop = errors.New("stop")

func (d *Decoder) eof(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("pickle: the file ends at byte %d before its STOP opcode (truncated?)", d.off)
	}
	return fmt.Errorf("pickle: read at byte %d: %w", d.off, err)
}

// memoNil stores a memoized None, told apart from a slot never stored.
type memoNil struct{ v any }

// put stores v in memo slot idx: the next slot (as CPython's pickler
// numbers them) or one stored before; never one past the end, so that a
// slot costs what was read to reach it.
func (d *Decoder) put(idx int, v any) error {
	if idx > len(d.memo) {
		return fmt.Errorf("memo slot %d stored when only %d were: the pickler numbers them in order (not a pickle CPython writes)", idx, len(d.memo))
	}
	if idx >= d.m.limits.MemoSlots {
		return fmt.Errorf("more than %d memo slots: %w", d.m.limits.MemoSlots, ErrLimit)
	}
	if v == nil {
		v = memoNil{}
	}
	if idx == len(d.memo) {
		d.memo = append(d.memo, v)
	} else {
		d.memo[idx] = v
	}
	switch x := v.(type) {
	case *List:
		x.memo = idx
	case *Dict:
		x.memo = idx
	}
	return nil
}

func (d *Decoder) get(idx int) error {
	if idx >= len(d.memo) {
		return fmt.Errorf("memo slot %d was never stored", idx)
	}
	v := d.memo[idx]
	if _, ok := v.(forgotten); ok {
		return fmt.Errorf("memo slot %d holds a value the reader already consumed (not a snapshot layout gpumem reads)", idx)
	}
	if m, ok := v.(memoNil); ok {
		v = m.v
	}
	d.push(v)
	return nil
}

func (d *Decoder) index(long bool) (int, error) {
	if long {
		b, err := d.n(4)
		if err != nil {
			return 0, err
		}
		return int(binary.LittleEndian.Uint32(b)), nil
	}
	b, err := d.byte()
	return int(b), err
}

// grown charges the slots a slice's growth from before to after items.
func (d *Decoder) grown(before, after int, what string) error {
	if after > before {
		return d.m.alloc(slotCost*int64(after-before), what)
	}
	return nil
}

// appendTo appends items to the list now on top of the stack, unless
// OnAppend consumes them.
func (d *Decoder) appendTo(items []any) error {
	if len(d.stack) == 0 {
		return errors.New("APPEND without a list")
	}
	l, ok := d.stack[len(d.stack)-1].(*List)
	if !ok {
		return fmt.Errorf("APPEND to a %T, not a list", d.stack[len(d.stack)-1])
	}
	if d.OnAppend != nil {
		consumed, err := d.OnAppend(l, items)
		if err != nil || consumed {
			return err
		}
	}
	if l.replaced {
		return errors.New("APPEND to a list the reader already consumed (not a snapshot layout gpumem reads)")
	}
	for _, it := range items {
		if m, ok := it.(*Dict); ok && m.consumed { // a trace entry met again: torch's never are
			return errors.New("APPEND of a dict the reader already consumed (not a snapshot layout gpumem reads)")
		}
	}
	before := cap(l.Items)
	if l.Items == nil { // most lists get all their items in one APPENDS
		l.Items = make([]any, 0, len(items))
	}
	l.Items = append(l.Items, items...)
	return d.grown(before, cap(l.Items), "a list")
}

// setItems sets key/value pairs of kv into dict; cut >= 0 pops the stack
// to cut afterwards (SETITEM).
func (d *Decoder) setItems(dict any, kv []any, cut int) error {
	m, ok := dict.(*Dict)
	if !ok {
		return fmt.Errorf("SETITEM(S) on a %T, not a dict", dict)
	}
	if m.consumed {
		return errors.New("SETITEM(S) on a dict the reader already consumed (not a snapshot layout gpumem reads)")
	}
	before := cap(m.Keys) + cap(m.Vals)
	if m.Keys == nil {
		m.Keys, m.Vals = make([]any, 0, len(kv)/2), make([]any, 0, len(kv)/2)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Keys, m.Vals = append(m.Keys, kv[i]), append(m.Vals, kv[i+1])
	}
	if cut >= 0 {
		d.stack = d.stack[:cut]
	}
	return d.grown(before, cap(m.Keys)+cap(m.Vals), "a dict")
}

// pushText reads a string or bytes value of n bytes. It is charged before
// it is read, and grows only as its bytes arrive: a length that the file
// does not hold costs nothing.
func (d *Decoder) pushText(n int64, text bool) error {
	if n > maxString {
		return fmt.Errorf("a string of %d bytes (the reader takes at most %d): %w", n, maxString, ErrLimit)
	}
	if err := d.m.alloc(n+slotCost, "a string"); err != nil {
		return err
	}
	if n <= int64(cap(d.buf)) {
		b, err := d.n(int(n))
		if err != nil {
			return err
		}
		if text {
			d.push(string(b))
		} else {
			d.push(append([]byte(nil), b...))
		}
		return nil
	}
	var buf bytes.Buffer
	buf.Grow(int(min(n, 1<<16)))
	got, err := io.CopyN(&buf, d.r, n)
	d.off += got
	if err != nil {
		return d.eofErr(err)
	}
	if text {
		d.push(buf.String())
	} else {
		d.push(buf.Bytes())
	}
	return nil
}

func (d *Decoder) push(v any) { d.stack = append(d.stack, v) }

// markFloor is the stack height at the innermost mark (values below it
// belong to an outer container).
func (d *Decoder) markFloor() int {
	if len(d.marks) == 0 {
		return 0
	}
	return d.marks[len(d.marks)-1]
}

func (d *Decoder) top() (any, error) {
	if len(d.stack) == d.markFloor() {
		return nil, errors.New("empty stack")
	}
	return d.stack[len(d.stack)-1], nil
}

func (d *Decoder) pop() (any, error) {
	v, err := d.top()
	if err != nil {
		return nil, err
	}
	d.stack = d.stack[:len(d.stack)-1]
	return v, nil
}

// popMark pops the values above the innermost mark. The slice is only
// valid until the next push.
func (d *Decoder) popMark() ([]any, error) {
	if len(d.marks) == 0 {
		return nil, errors.New("no mark on the stack")
	}
	m := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	items := d.stack[m:]
	d.stack = d.stack[:m]
	return items, nil
}

func (d *Decoder) byte() (byte, error) {
	b, err := d.r.ReadByte()
	if err != nil {
		return 0, d.eofErr(err)
	}
	d.off++
	return b, nil
}

// n reads n bytes (at most the buffer's 256, or 8 for a length) into
// the decoder's buffer (valid until the next read).
func (d *Decoder) n(n int) ([]byte, error) {
	if n < 0 || n > cap(d.buf) {
		return nil, fmt.Errorf("length %d out of range", n)
	}
	b := d.buf[:n]
	if _, err := io.ReadFull(d.r, b); err != nil {
		return nil, d.eofErr(err)
	}
	d.off += int64(n)
	return b, nil
}

func (d *Decoder) eofErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("the file ends at byte %d, inside an opcode (truncated?): %w", d.off, io.ErrUnexpectedEOF)
	}
	return err
}
