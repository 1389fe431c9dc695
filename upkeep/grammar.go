package upkeep

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The grammar of every upkeep input, whichever surface takes it: a control
// file's write, an HTTP body, a flag. It is here, once, so that no surface
// accepts what another refuses (upkeeptest.Cases is the table each one
// runs).
//
// A command (control file, HTTP body) is one token exactly as documented,
// with at most one trailing "\n" (echo's); nothing else is trimmed: " 1h",
// "1h\r\n" or "1h\n\n" is not what anyone types on purpose, and guessing
// would turn a slip into a change.
//
// A duration is one or more groups of an unsigned decimal number (digits,
// optionally a fraction: 1.5h) and a unit (h, m, s, ms, us or µs, ns), the
// units in decreasing order and each at most once: 15m, 1h30m, 90s. It is
// time.ParseDuration's language less its sign, its bare "0", its ".5h" and
// its repeats ("5m5m", "30m1h"), which are slips rather than intent.

// Command is the command in one control input: data less at most one
// trailing newline.
func Command(data []byte) string {
	return strings.TrimSuffix(string(data), "\n")
}

// CheckRun accepts the command of the sweep and scrub control files: run.
func CheckRun(cmd string) error {
	if cmd != "run" {
		return fmt.Errorf("%w: %q: want run", ErrBadInput, Clip(cmd))
	}
	return nil
}

var units = []struct {
	name string
	d    time.Duration
}{
	{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond},
	{"us", time.Microsecond}, {"µs", time.Microsecond}, {"ns", time.Nanosecond},
}

var errDuration = errors.New("a duration is unsigned, such as 15m, 1h30m or 1.5h, each unit (h, m, s, ms, us, ns) once and in that order")

// ParseDuration parses a duration of the grammar above. The result is
// positive unless every number is 0 (0s), which the callers' bounds
// refuse.
func ParseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, errDuration
	}
	rest, last := s, -1
	for rest != "" {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 {
			return 0, errDuration
		}
		if i < len(rest) && rest[i] == '.' {
			j := i + 1
			for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
				j++
			}
			if j == i+1 {
				return 0, errDuration
			}
			i = j
		}
		rest = rest[i:]
		u := -1
		for k, un := range units {
			// Longest unit first where two share a prefix (ms before m).
			if strings.HasPrefix(rest, un.name) && (u < 0 || len(un.name) > len(units[u].name)) {
				u = k
			}
		}
		if u < 0 {
			return 0, errDuration
		}
		rank := u
		if units[u].name == "µs" {
			rank = u - 1 // us and µs are one unit
		}
		if rank <= last {
			return 0, errDuration
		}
		last = rank
		rest = rest[len(units[u].name):]
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errDuration // out of range
	}
	return d, nil
}

// ParseEvery parses a timer flag (--sweep-every, --scrub-every, and their
// mount options): a duration of at least a second, or the literal 0 or
// off for no timer. A duration that comes to less than that (0s, 0h,
// 0.0m, 0.0000000001s, 999ms) is refused, not taken as off: only the
// words for off turn a timer off, as on the control files and HTTP.
// Its bounds are CheckSweepEvery's and CheckScrub's.
func ParseEvery(s string) (time.Duration, error) {
	if s == "0" || s == "off" {
		return 0, nil
	}
	// Both timers' least interval is a second (MinSweepInterval,
	// MinScrubInterval): say so here too.
	least := min(MinSweepInterval, MinScrubInterval)
	d, err := ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%w: want 0 or off, or at least %s: %v", ErrBadInput, least, err)
	}
	if d < least {
		return 0, fmt.Errorf("%w: %q is %s: want 0 or off for no timer, or at least %s", ErrBadInput, Clip(s), d, least)
	}
	return d, nil
}
