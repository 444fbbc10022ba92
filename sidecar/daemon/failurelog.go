package daemon

import "time"

// failureLogEvery is how often a failure that lasts is logged again.
const failureLogEvery = time.Minute

// failureLog decides which occurrences of a failure that repeats every
// sample are logged: the first, one with a new message, and one a minute
// while it lasts; the recovery says how many there were. A daemon whose
// NVML or /proc fails each second would otherwise write a warning a
// second.
type failureLog struct {
	msg    string
	count  int // failures since the last success
	since  int // failures not logged since the last one logged
	logged time.Time
}

// fail counts a failure with message msg at now and says whether to log
// it, and how many earlier failures went unlogged since the last logged.
func (f *failureLog) fail(now time.Time, msg string) (log bool, unlogged int) {
	f.count++
	if f.count == 1 || msg != f.msg || now.Sub(f.logged) >= failureLogEvery {
		unlogged, f.since = f.since, 0
		f.msg, f.logged = msg, now
		return true, unlogged
	}
	f.since++
	return false, 0
}

// ok ends a run of failures and returns how many it had (0: none).
func (f *failureLog) ok() int {
	n := f.count
	*f = failureLog{}
	return n
}
