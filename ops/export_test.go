package ops

import "time"

// SetTierInterval sets how often tier sizes are recounted, for metrics
// made afterwards, until the test ends.
func SetTierInterval(t interface{ Cleanup(func()) }, d time.Duration) {
	old := tierInterval
	tierInterval = d
	t.Cleanup(func() { tierInterval = old })
}

// SetMaxNamespaceSeries bounds the namespaces a scrape reports, until the
// test ends.
func SetMaxNamespaceSeries(t interface{ Cleanup(func()) }, n int) {
	old := maxNamespaceSeries
	maxNamespaceSeries = n
	t.Cleanup(func() { maxNamespaceSeries = old })
}

// SetNamespaceInterval sets how often namespace usage is recounted for
// /metrics, for servers made afterwards, until the test ends.
func SetNamespaceInterval(t interface{ Cleanup(func()) }, d time.Duration) {
	old := nsInterval
	nsInterval = d
	t.Cleanup(func() { nsInterval = old })
}
