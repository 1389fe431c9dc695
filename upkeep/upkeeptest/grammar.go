// Package upkeeptest holds the table of upkeep inputs that every surface
// runs: the upkeep parser itself, the mount's control files, the HTTP
// upkeep routes and the CLI's flags. One table, so that no surface
// accepts what another refuses (docs/mount.md, http.md and cli.md state
// the grammar it checks).
package upkeeptest

// Before is the sweep timer each timer case starts from, written first
// through the same surface: so "on" has an interval to resume, and a
// refused input is seen to leave it.
const Before = "2h"

// BeforeRead is Before as the timer reads back.
const BeforeRead = "2h0m0s"

// Case is one input and what each kind of surface makes of it.
type Case struct {
	Input string
	// Timer is what the sweep timer reads after Input is sent as a
	// command (a control file's one write, an HTTP body) to a timer at
	// Before; "" means bad input: EINVAL or 400, the timer unchanged.
	Timer string
	// Every is what Input means as a --sweep-every or --scrub-every
	// value (the mount options too), as time.Duration prints it; "" means
	// a usage error.
	Every string
}

// Cases are the timer inputs.
var Cases = []Case{
	{"off", "off", "0s"},
	{"off\n", "off", ""},
	{"on", BeforeRead, ""},
	{"on\n", BeforeRead, ""},
	{"1h", "1h0m0s", "1h0m0s"},
	{"1h\n", "1h0m0s", ""},
	{"90s", "1m30s", "1m30s"},
	{"1h30m", "1h30m0s", "1h30m0s"},
	{"1.5h", "1h30m0s", "1h30m0s"},
	{"3600000ms", "1h0m0s", "1h0m0s"},
	{"1s", "1s", "1s"},
	{"0", "", "0s"},
	// Only the literal 0 and off turn a flag's timer off: a duration
	// that comes to zero, or to less than the least interval, is refused.
	{"0s", "", ""},
	{"0h", "", ""},
	{"0m", "", ""},
	{"0.0m", "", ""},
	{"0.0000000001s", "", ""},
	{"0ns", "", ""},
	{"1ns", "", ""},
	{"0.9s", "", ""},
	{"00", "", ""},
	{"999ms", "", ""},
	{"1µs", "", ""},
	{"", "", ""},
	{"\n", "", ""},
	{" ", "", ""},
	{" 1h", "", ""},
	{"\t1h", "", ""},
	{"1h ", "", ""},
	{"1h\r\n", "", ""},
	{"1h\n\n", "", ""},
	{"\t1h\n", "", ""},
	{"1h\n2h", "", ""},
	{"+5m", "", ""},
	{"-5m", "", ""},
	{"+0", "", ""},
	{"5m5m", "", ""},
	{"1h1h", "", ""},
	{"30m1h", "", ""},
	{"1s1h", "", ""},
	{".5h", "", ""},
	{"1.h", "", ""},
	{"1", "", ""},
	{"1 h", "", ""},
	{"h", "", ""},
	{"1e3s", "", ""},
	{"0x10s", "", ""},
	{"10000000000h", "", ""},
	{"ON", "", ""},
	{"Off", "", ""},
	{"on\n\n", "", ""},
	{" off", "", ""},
	{"off\x00", "", ""},
	{"run", "", ""},
}

// RunCase is a command to the sweep and scrub control files.
type RunCase struct {
	Input string
	OK    bool
}

// RunCases are the sweep and scrub commands.
var RunCases = []RunCase{
	{"run", true},
	{"run\n", true},
	{"\n", false},
	{" run", false},
	{"run ", false},
	{"run\n\n", false},
	{"run\r\n", false},
	{"RUN", false},
	{"run\nrun", false},
	{"runrun", false},
	{"1h", false},
	{"on", false},
}
