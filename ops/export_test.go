package ops

import "time"

// SetTierInterval sets how often tier sizes are recounted, for metrics
// made afterwards, until the test ends.
func SetTierInterval(t interface{ Cleanup(func()) }, d time.Duration) {
	old := tierInterval
	tierInterval = d
	t.Cleanup(func() { tierInterval = old })
}
