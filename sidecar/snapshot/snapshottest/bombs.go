// Package snapshottest builds the hostile pickles that gpumem's tests hand
// the snapshot reader (a user of a shared daemon may send any file), and a
// large plain one: bytes only, for unit, fuzz and end-to-end tests alike.
// It never reads or runs a pickle.
package snapshottest

import (
	"bufio"
	"encoding/binary"
	"io"
	"strings"
)

// MemoIndexBomb is 9 bytes that store a value in memo slot 33,554,416:
// a reader that allocates the memo up to the index it is given holds
// half a GiB for it.
func MemoIndexBomb() []byte {
	return []byte("\x80\x04Nr\xf0\xff\xff\x01.")
}

// DupBomb is a None duplicated n times (one byte each): n values on the
// stack, 16 bytes each to a reader without a bound on its stack.
func DupBomb(n int) []byte {
	return []byte("\x80\x04N" + strings.Repeat("2", n) + ".")
}

// CPUBomb is a device trace that appends, appends times, one trace entry
// of keys keys (its "action" last) kept in a memo slot that outlives the
// slot the reader forgets: a reader that looks the entry's keys up
// anew each time it meets it does keys × appends comparisons (100,000 ×
// 1,000,000 in 2.3 MB: hours). pad bytes of no-ops follow each batch of
// 1,000 appends.
func CPUBomb(keys, appends, pad int) []byte {
	var b strings.Builder
	b.WriteString("\x80\x04]}\x8c\x01xq\x000(")
	for i := 1; i < keys; i++ { // in SETITEMS of 1,000 pairs, as CPython batches them
		if b.WriteString("h\x00N"); i%1000 == 0 {
			b.WriteString("u(")
		}
	}
	b.WriteString("\x8c\x06action\x8c\x05allocuq\x01q\x020")
	for done := 0; done < appends; {
		n := min(1000, appends-done)
		b.WriteString("(" + strings.Repeat("h\x01", n) + "e")
		b.WriteString(strings.Repeat("N0", pad/2))
		done += n
	}
	b.WriteString(".")
	return []byte(b.String())
}

// Keys of the trace entries WriteLarge writes, memoized once each.
var largeKeys = []string{"action", "alloc", "free_completed", "addr", "size", "time_us"}

// WriteLarge writes a plain snapshot of entries trace entries (28 bytes
// each: 36 MB a million), allocs and their frees in turn, without frames:
// one that takes a reader seconds to go through.
func WriteLarge(w io.Writer, entries int) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	bw.WriteString("\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](]")
	for i, k := range largeKeys {
		bw.Write(append(append([]byte{0x8c, byte(len(k))}, k...), 'q', byte(i), '0'))
	}
	var num [5]byte
	num[0] = 'J'
	for done := 0; done < entries; {
		n := min(1000, entries-done)
		bw.WriteString("(")
		for j := 0; j < n; j++ {
			i := done + j
			action := "h\x01"
			if i%2 == 1 {
				action = "h\x02"
			}
			bw.WriteString("}(h\x00" + action + "h\x03")
			binary.LittleEndian.PutUint32(num[1:], uint32(i/2)*4096)
			bw.Write(num[:])
			bw.WriteString("h\x04")
			binary.LittleEndian.PutUint32(num[1:], 4096)
			bw.Write(num[:])
			bw.WriteString("h\x05")
			binary.LittleEndian.PutUint32(num[1:], uint32(i))
			bw.Write(num[:])
			bw.WriteString("u")
		}
		bw.WriteString("e")
		done += n
	}
	bw.WriteString("eu.")
	return bw.Flush()
}

// SlotBomb is a list of batches × 1,000 Nones, appended 1,000 at a time
// as CPython batches them (1 byte a value): a reader that holds the list
// spends 16 bytes a byte of file.
func SlotBomb(batches int) []byte {
	return []byte("\x80\x04]" + strings.Repeat("("+strings.Repeat("N", 1000)+"e", batches) + ".")
}

// SegmentBomb lists one segment of keys keys refs times through the memo
// (2 bytes a reference): a reader that looks the segment's fields up at
// each reference compares about 8 × keys × refs keys (20,000 × 1,000,000
// in 2.1 MB: an hour of one core).
func SegmentBomb(keys, refs int) []byte {
	var b strings.Builder
	b.WriteString("\x80\x04}(\x8c\x08segments](}(\x8c\x01xq\x00N")
	for i := 1; i < keys; i++ { // in SETITEMS of 1,000 pairs
		if b.WriteString("h\x00N"); i%1000 == 0 {
			b.WriteString("u(")
		}
	}
	b.WriteString("\x8c\x06deviceK\x00uq\x01e")
	for done := 0; done < refs; done += 1000 {
		b.WriteString("(" + strings.Repeat("h\x01", min(1000, refs-done)) + "e")
	}
	b.WriteString("u.")
	return []byte(b.String())
}
