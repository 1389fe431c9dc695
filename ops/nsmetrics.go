package ops

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// maxNamespaceSeries bounds the namespaces a count covers, in name order:
// each costs a usage lookup, and a series per namespace is a series a
// Prometheus server keeps. A variable for tests.
var maxNamespaceSeries = 10000

// nsInterval is how often the namespaces' usage is counted at most. A
// variable for tests.
var nsInterval = 15 * time.Second

var (
	descNSBytes      = desc("alkblobfs_namespace_bytes", "Bytes of the blobs a namespace links (a blob two namespaces link counts in both).", "namespace")
	descNSBlobs      = desc("alkblobfs_namespace_blobs", "Blobs a namespace links.", "namespace")
	descNSQuotaBytes = desc("alkblobfs_namespace_quota_bytes", "A namespace's byte quota (absent: no limit).", "namespace")
	descNSQuotaBlobs = desc("alkblobfs_namespace_quota_blobs", "A namespace's blob quota (absent: no limit).", "namespace")
)

// nsCollector reports, at one scrape, the usage of the namespaces the
// caller may search (and, for a token bound to namespaces, names), from
// the server's last count.
type nsCollector struct {
	s   *Server
	c   *Caller
	ctx context.Context
}

// Describe describes nothing: an unchecked collector.
func (n *nsCollector) Describe(chan<- *prometheus.Desc) {}

func (n *nsCollector) Collect(ch chan<- prometheus.Metric) {
	if n.c.may(VerbRead) != nil {
		return
	}
	gauge := func(d *prometheus.Desc, v int64, ns string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), ns)
	}
	for _, u := range n.s.usages.get() {
		if !n.c.bound(u.name) {
			continue
		}
		p, err := n.s.perm(n.ctx, u.name)
		if err != nil || namespaces.Allowed(p, n.c.Principal, namespaces.Search) != nil {
			continue // removed since the count, or not the caller's to see
		}
		gauge(descNSBytes, u.Bytes, u.name)
		gauge(descNSBlobs, u.Blobs, u.name)
		if u.Quota.Bytes > 0 {
			gauge(descNSQuotaBytes, u.Quota.Bytes, u.name)
		}
		if u.Quota.Blobs > 0 {
			gauge(descNSQuotaBlobs, u.Quota.Blobs, u.name)
		}
	}
}

type nsUsage struct {
	name string
	namespaces.Usage
}

// countUsages counts every namespace's usage, for a recounter: a row read
// per namespace, up to maxNamespaceSeries of them, which a scrape must not
// wait for. It reads the kept counters only (Registry.Usage), never the
// unique figures (Registry.Unique), a query over all of a namespace's
// references that would make every count a scan of them all. A listing
// that fails makes the count not whole. Nil without namespaces.
func countUsages(svc *namespaces.Service, log interface{ Warn(string, ...any) }) func(context.Context) ([]nsUsage, bool) {
	if svc == nil {
		return nil
	}
	return func(ctx context.Context) ([]nsUsage, bool) {
		var got []nsUsage
		failed := false
		for name, err := range svc.Names(ctx, "") {
			if err != nil {
				log.Warn("metrics: listing the namespaces for their usage", "err", err)
				failed = true
				break
			}
			if len(got) == maxNamespaceSeries {
				log.Warn("metrics: reporting the usage of the first namespaces only", "most", maxNamespaceSeries)
				break
			}
			u, err := svc.Usage(ctx, name)
			if errors.Is(err, namespaces.ErrNotFound) {
				continue // removed since it was listed
			}
			if err != nil {
				log.Warn("metrics: reading a namespace's usage", "namespace", name, "err", err)
				continue
			}
			got = append(got, nsUsage{name, u})
		}
		return got, !failed
	}
}
