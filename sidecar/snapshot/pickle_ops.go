package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
)

// The opcodes, by kind: the stack's and memo's (step), scalars and text
// (stepValue), containers (stepContainer).

// step runs one opcode.
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
		if len(d.marks) >= d.m.limits.Depth {
			return fmt.Errorf("more than %d nested marks: %w", d.m.limits.Depth, ErrLimit)
		}
		d.marks = append(d.marks, len(d.stack))
	case opPop:
		_, err := d.pop()
		return err
	case opPopMark:
		_, err := d.popMark()
		return err
	case opDup:
		v, err := d.top()
		if err != nil {
			return err
		}
		d.push(v)
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
		return d.get(idx)
	default:
		if ok, err := d.stepValue(op); ok {
			return err
		}
		if ok, err := d.stepContainer(op); ok {
			return err
		}
		return fmt.Errorf("not plain data: gpumem reads only pickles of dicts, lists, tuples, strings and numbers "+
			"(as torch.cuda.memory._dump_snapshot writes them); opcode %q is not one of them", rune(op))
	}
	return nil
}

// stepValue runs op if it pushes a scalar or text (ok false if not one).
func (d *Decoder) stepValue(op byte) (ok bool, err error) {
	switch op {
	case opNone:
		d.push(nil)
	case opNewTrue:
		d.push(true)
	case opNewFalse:
		d.push(false)
	case opBinInt, opBinInt2:
		n := 4
		if op == opBinInt2 {
			n = 2
		}
		b, err := d.n(n)
		if err != nil {
			return true, err
		}
		if n == 2 {
			d.push(int64(binary.LittleEndian.Uint16(b)))
		} else {
			d.push(int64(int32(binary.LittleEndian.Uint32(b))))
		}
	case opBinInt1:
		b, err := d.byte()
		if err != nil {
			return true, err
		}
		d.push(int64(b))
	case opLong1, opLong4:
		return true, d.pushLong(op == opLong4)
	case opBinFloat:
		b, err := d.n(8)
		if err != nil {
			return true, err
		}
		d.push(math.Float64frombits(binary.BigEndian.Uint64(b)))
	case opShortBinUni, opShortBinBytes, opShortBinString:
		n, err := d.byte()
		if err != nil {
			return true, err
		}
		return true, d.pushText(int64(n), op == opShortBinUni || op == opShortBinString)
	case opBinUnicode, opBinBytes:
		b, err := d.n(4)
		if err != nil {
			return true, err
		}
		return true, d.pushText(int64(binary.LittleEndian.Uint32(b)), op == opBinUnicode)
	case opBinUnicode8, opBinBytes8:
		b, err := d.n(8)
		if err != nil {
			return true, err
		}
		n := binary.LittleEndian.Uint64(b)
		if n > maxString {
			return true, fmt.Errorf("a string of %d bytes (the reader takes at most %d): %w", n, maxString, ErrLimit)
		}
		return true, d.pushText(int64(n), op == opBinUnicode8)
	default:
		return false, nil
	}
	return true, nil
}

// maxLong bounds a LONG1/LONG4 integer's bytes: a snapshot's integers
// are addresses, sizes and times.
const maxLong = 256

func (d *Decoder) pushLong(long4 bool) error {
	var n int
	if !long4 {
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
		if n = int(int32(binary.LittleEndian.Uint32(b))); n < 0 || n > maxLong {
			return fmt.Errorf("an integer of %d bytes (the reader takes at most %d): %w", n, maxLong, ErrLimit)
		}
	}
	b, err := d.n(n)
	if err != nil {
		return err
	}
	d.push(decodeLong(b))
	return nil
}

// stepContainer runs op if it builds or fills a container.
func (d *Decoder) stepContainer(op byte) (ok bool, err error) {
	switch op {
	case opEmptyDict:
		err = d.m.alloc(dictCost, "a dict")
		d.push(&Dict{memo: -1})
	case opEmptyList:
		err = d.m.alloc(listCost, "a list")
		d.push(&List{memo: -1})
	case opEmptyTuple:
		d.push(Tuple{})
	case opDict:
		items, err := d.popMark()
		if err != nil {
			return true, err
		}
		if len(items)%2 != 0 {
			return true, errors.New("DICT with an odd number of items")
		}
		dict := &Dict{memo: -1, Keys: make([]any, 0, len(items)/2), Vals: make([]any, 0, len(items)/2)}
		for i := 0; i < len(items); i += 2 {
			dict.Keys, dict.Vals = append(dict.Keys, items[i]), append(dict.Vals, items[i+1])
		}
		d.push(dict)
		return true, d.m.alloc(dictCost+slotCost*int64(len(items)), "a dict")
	case opList:
		items, err := d.popMark()
		if err != nil {
			return true, err
		}
		d.push(&List{Items: append([]any(nil), items...), memo: -1})
		return true, d.m.alloc(listCost+slotCost*int64(len(items)), "a list")
	case opTuple, opTuple1, opTuple2, opTuple3:
		return true, d.tuple(op)
	case opAppend:
		v, err := d.pop()
		if err != nil {
			return true, err
		}
		return true, d.appendTo([]any{v})
	case opAppends:
		items, err := d.popMark()
		if err != nil {
			return true, err
		}
		return true, d.appendTo(items)
	case opSetItem:
		if len(d.stack)-d.markFloor() < 3 {
			return true, errors.New("SETITEM without a dict, key and value")
		}
		n := len(d.stack)
		return true, d.setItems(d.stack[n-3], d.stack[n-2:], n-2)
	case opSetItems:
		items, err := d.popMark()
		if err != nil {
			return true, err
		}
		if len(items)%2 != 0 {
			return true, errors.New("SETITEMS with an odd number of items")
		}
		if len(d.stack) == 0 {
			return true, errors.New("SETITEMS without a dict")
		}
		return true, d.setItems(d.stack[len(d.stack)-1], items, -1)
	default:
		return false, nil
	}
	return true, err
}

// tuple builds a tuple of the values above the mark (TUPLE) or of the
// top 1 to 3 (TUPLE1..3).
func (d *Decoder) tuple(op byte) error {
	var items []any
	if op == opTuple {
		var err error
		if items, err = d.popMark(); err != nil {
			return err
		}
	} else {
		n := int(op-opTuple1) + 1
		if len(d.stack)-d.markFloor() < n {
			return fmt.Errorf("TUPLE%d with %d values on the stack", n, len(d.stack)-d.markFloor())
		}
		items = d.stack[len(d.stack)-n:]
		d.stack = d.stack[:len(d.stack)-n]
	}
	d.push(append(Tuple(nil), items...))
	return d.m.alloc(slotCost*int64(len(items)+1), "a tuple")
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
