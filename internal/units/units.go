// Package units formats byte counts for people, in binary (IEC) units, as
// every Go output of gpumem prints them (`gpumem ls`, the daemon's alerts and
// logs). Bytes are uint64 counts everywhere inside; this is the one place
// that turns them into text. Pure: no I/O, no state.
package units

import "strconv"

// Bytes renders b with one decimal in the largest binary unit that keeps
// the number at or above 1: "0 B", "1023 B", "1.5 KiB", "10.2 GiB", "3.0 TiB".
// PiB is the largest unit.
func Bytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return strconv.FormatUint(b, 10) + " B"
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(float64(b)/float64(div), 'f', 1, 64) + " " + string("KMGTP"[exp]) + "iB"
}
