package snapshot

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
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
	Items []any
	memo  int // memo slot holding the list, -1 if none
}

// Dict is a pickled dict, its keys in order.
type Dict struct {
	Keys, Vals []any
	memo       int
	// tag is the reducer's own mark (a frame dict's id + 1), so that a
	// frame met again costs no lookup.
	tag int32
}

// Get returns the value of string key k.
func (d *Dict) Get(k string) (any, bool) {
	for i, key := range d.Keys {
		if s, ok := key.(string); ok && s == k {
			return d.Vals[i], true
		}
	}
	return nil, false
}

// Tuple is a pickled tuple.
type Tuple []any

// forgotten marks a memo slot whose value was consumed; reading it again is
// an error (the snapshots gpumem reads never do).
type forgotten struct{}

// Limits bound what a pickle may make the decoder hold: a hostile file
// gets an error, never the daemon's memory.
type Limits struct {
	MemoSlots int // memo entries
	Retained  int // container items held (not consumed) at once
	Depth     int // nested containers and marks
}

// DefaultLimits suit a snapshot of tens of millions of trace entries.
var DefaultLimits = Limits{MemoSlots: 1 << 25, Retained: 1 << 24, Depth: 256}

// ErrLimit is wrapped by a decoder's error when a pickle passes a Limit.
var ErrLimit = errors.New("over the reader's limits")

// Decoder reads one pickle.
type Decoder struct {
	r      *bufio.Reader
	off    int64
	limits Limits
	stack  []any
	marks  []int
	memo   []any
	held   int
	buf    []byte
	// OnAppend is offered the items about to be appended to l (APPEND,
	// APPENDS); when it returns true they are not appended, and it may
	// Forget them.
	OnAppend func(l *List, items []any) bool
}

// NewDecoder reads from r.
func NewDecoder(r io.Reader, limits Limits) *Decoder {
	return &Decoder{r: bufio.NewReaderSize(r, 1<<20), limits: limits, buf: make([]byte, 256)}
}

// Offset is how many bytes were read.
func (d *Decoder) Offset() int64 { return d.off }

// Forget drops dict (read by this decoder, and consumed) from the memo
// and from the count of values held: its memory goes once its caller lets
// it go.
func (d *Decoder) Forget(dict *Dict) {
	if dict.memo >= 0 && dict.memo < len(d.memo) {
		d.memo[dict.memo] = forgotten{}
	}
	d.held -= len(dict.Keys)
}

// Replace puts v in the memo slot of l, which was consumed, and drops l's
// items: a later reference to l reads v.
func (d *Decoder) Replace(l *List, v any) {
	if l.memo >= 0 && l.memo < len(d.memo) {
		d.memo[l.memo] = v
	}
	d.held -= len(l.Items)
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

// maxString bounds one string or bytes value.
const maxString = 64 << 20

// Decode reads the pickle's one value.
func (d *Decoder) Decode() (any, error) {
	for {
		at := d.off
		op, err := d.byte()
		if err != nil {
			return nil, d.eof(err)
		}
		if err := d.step(op); err != nil {
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

var errStop = errors.New("stop")

func (d *Decoder) eof(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("pickle: the file ends at byte %d before its STOP opcode (truncated?)", d.off)
	}
	return fmt.Errorf("pickle: read at byte %d: %w", d.off, err)
}

func (d *Decoder) step(op byte) error {
	switch op {
	case opProto:
		v, err := d.byte()
		if err != nil {
			return err
		}
		if v < 2 || v > 5 {
			return fmt.Errorf("protocol %d: only protocols 2 to 5 are read", v)
		}
	case opFrame:
		_, err := d.n(8) // frames only group opcodes for buffering
		return err
	case opStop:
		return errStop
	case opMark:
		if len(d.marks) >= d.limits.Depth {
			return fmt.Errorf("more than %d nested marks: %w", d.limits.Depth, ErrLimit)
		}
		d.marks = append(d.marks, len(d.stack))
	case opPop:
		if _, err := d.pop(); err != nil {
			return err
		}
	case opPopMark:
		if _, err := d.popMark(); err != nil {
			return err
		}
	case opDup:
		v, err := d.top()
		if err != nil {
			return err
		}
		d.push(v)
	case opNone:
		d.push(nil)
	case opNewTrue:
		d.push(true)
	case opNewFalse:
		d.push(false)
	case opBinInt:
		b, err := d.n(4)
		if err != nil {
			return err
		}
		d.push(int64(int32(binary.LittleEndian.Uint32(b))))
	case opBinInt1:
		b, err := d.byte()
		if err != nil {
			return err
		}
		d.push(int64(b))
	case opBinInt2:
		b, err := d.n(2)
		if err != nil {
			return err
		}
		d.push(int64(binary.LittleEndian.Uint16(b)))
	case opLong1, opLong4:
		var n int
		if op == opLong1 {
			b, err := d.byte()
			if err != nil {
				return err
			}
			n = int(b)
		} else {
			b, err := d.n(4)
			if err != nil {
				return err
			}
			n = int(int32(binary.LittleEndian.Uint32(b)))
			if n < 0 || n > 1<<16 {
				return fmt.Errorf("LONG4 of %d bytes", n)
			}
		}
		b, err := d.n(n)
		if err != nil {
			return err
		}
		d.push(decodeLong(b))
	case opBinFloat:
		b, err := d.n(8)
		if err != nil {
			return err
		}
		d.push(math.Float64frombits(binary.BigEndian.Uint64(b)))
	case opShortBinUni, opShortBinBytes, opShortBinString:
		n, err := d.byte()
		if err != nil {
			return err
		}
		return d.pushText(int64(n), op == opShortBinUni || op == opShortBinString)
	case opBinUnicode, opBinBytes:
		b, err := d.n(4)
		if err != nil {
			return err
		}
		return d.pushText(int64(binary.LittleEndian.Uint32(b)), op == opBinUnicode)
	case opBinUnicode8, opBinBytes8:
		b, err := d.n(8)
		if err != nil {
			return err
		}
		n := binary.LittleEndian.Uint64(b)
		if n > maxString {
			return fmt.Errorf("a string of %d bytes: %w", n, ErrLimit)
		}
		return d.pushText(int64(n), op == opBinUnicode8)
	case opEmptyDict:
		d.push(&Dict{memo: -1})
	case opEmptyList:
		d.push(&List{memo: -1})
	case opEmptyTuple:
		d.push(Tuple{})
	case opDict:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		if len(items)%2 != 0 {
			return errors.New("DICT with an odd number of items")
		}
		dict := &Dict{memo: -1}
		for i := 0; i < len(items); i += 2 {
			dict.Keys, dict.Vals = append(dict.Keys, items[i]), append(dict.Vals, items[i+1])
		}
		d.push(dict)
	case opList:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		d.push(&List{Items: append([]any(nil), items...), memo: -1})
	case opTuple:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		d.push(append(Tuple(nil), items...))
	case opTuple1, opTuple2, opTuple3:
		n := int(op-opTuple1) + 1
		if len(d.stack)-d.markFloor() < n {
			return fmt.Errorf("TUPLE%d with %d values on the stack", n, len(d.stack)-d.markFloor())
		}
		t := append(Tuple(nil), d.stack[len(d.stack)-n:]...)
		d.stack = d.stack[:len(d.stack)-n]
		d.push(t)
	case opAppend:
		v, err := d.pop()
		if err != nil {
			return err
		}
		return d.appendTo([]any{v})
	case opAppends:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		return d.appendTo(items)
	case opSetItem:
		if len(d.stack)-d.markFloor() < 3 {
			return errors.New("SETITEM without a dict, key and value")
		}
		n := len(d.stack)
		return d.setItems(d.stack[n-3], d.stack[n-2:], n-2)
	case opSetItems:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		if len(items)%2 != 0 {
			return errors.New("SETITEMS with an odd number of items")
		}
		if len(d.stack) == 0 {
			return errors.New("SETITEMS without a dict")
		}
		return d.setItems(d.stack[len(d.stack)-1], items, -1)
	case opMemoize:
		v, err := d.top()
		if err != nil {
			return err
		}
		return d.put(len(d.memo), v)
	case opBinPut, opLongBinPut:
		idx, err := d.index(op == opLongBinPut)
		if err != nil {
			return err
		}
		v, err := d.top()
		if err != nil {
			return err
		}
		return d.put(idx, v)
	case opBinGet, opLongBinGet:
		idx, err := d.index(op == opLongBinGet)
		if err != nil {
			return err
		}
		if idx >= len(d.memo) || d.memo[idx] == nil {
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
	default:
		return fmt.Errorf("not plain data: gpumem reads only pickles of dicts, lists, tuples, strings and numbers "+
			"(as torch.cuda.memory._dump_snapshot writes them); opcode %q is not one of them", rune(op))
	}
	return nil
}

// memoNil stores a memoized None, told apart from a slot never stored.
type memoNil struct{ v any }

func (d *Decoder) put(idx int, v any) error {
	if idx >= d.limits.MemoSlots {
		return fmt.Errorf("memo slot %d: %w", idx, ErrLimit)
	}
	if v == nil {
		v = memoNil{}
	}
	for len(d.memo) <= idx {
		d.memo = append(d.memo, nil)
	}
	d.memo[idx] = v
	switch x := v.(type) {
	case *List:
		x.memo = idx
	case *Dict:
		x.memo = idx
	}
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
	if d.OnAppend != nil && d.OnAppend(l, items) {
		return nil
	}
	if d.held += len(items); d.held > d.limits.Retained {
		return fmt.Errorf("more than %d values held: %w", d.limits.Retained, ErrLimit)
	}
	if l.Items == nil { // most lists get all their items in one APPENDS
		l.Items = make([]any, 0, len(items))
	}
	l.Items = append(l.Items, items...)
	return nil
}

// setItems sets key/value pairs of kv into dict; cut >= 0 pops the stack
// to cut afterwards (SETITEM).
func (d *Decoder) setItems(dict any, kv []any, cut int) error {
	m, ok := dict.(*Dict)
	if !ok {
		return fmt.Errorf("SETITEM(S) on a %T, not a dict", dict)
	}
	if d.held += len(kv) / 2; d.held > d.limits.Retained {
		return fmt.Errorf("more than %d values held: %w", d.limits.Retained, ErrLimit)
	}
	if m.Keys == nil {
		m.Keys, m.Vals = make([]any, 0, len(kv)/2), make([]any, 0, len(kv)/2)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Keys, m.Vals = append(m.Keys, kv[i]), append(m.Vals, kv[i+1])
	}
	if cut >= 0 {
		d.stack = d.stack[:cut]
	}
	return nil
}

func (d *Decoder) pushText(n int64, text bool) error {
	if n > maxString {
		return fmt.Errorf("a string of %d bytes: %w", n, ErrLimit)
	}
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

// n reads n bytes into the decoder's buffer (valid until the next read).
func (d *Decoder) n(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("negative length %d", n)
	}
	if cap(d.buf) < n {
		d.buf = make([]byte, n)
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

// decodeLong is a LONG1/LONG4 value: little-endian two's complement; an
// int64 when it fits, else a float64.
func decodeLong(b []byte) any {
	if len(b) == 0 {
		return int64(0)
	}
	if len(b) <= 8 {
		var u uint64
		for i := len(b) - 1; i >= 0; i-- {
			u = u<<8 | uint64(b[i])
		}
		if shift := 64 - 8*uint(len(b)); shift > 0 {
			return int64(u<<shift) >> shift
		}
		return int64(u)
	}
	be := make([]byte, len(b))
	for i := range b {
		be[len(b)-1-i] = b[i]
	}
	n := new(big.Int).SetBytes(be)
	if b[len(b)-1]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	if n.IsInt64() {
		return n.Int64()
	}
	f, _ := new(big.Float).SetInt(n).Float64()
	return f
}
