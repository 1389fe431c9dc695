package ops

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// maxNamespaceSeries bounds the namespaces one scrape reports, in name
// order: each costs a usage lookup, and a series per namespace is a
// series a Prometheus server keeps. A variable for tests.
var maxNamespaceSeries = 10000

var (
	descNSBytes       = desc("alkblobfs_namespace_bytes", "Bytes of the blobs a namespace links (a blob two namespaces link counts in both).", "namespace")
	descNSBlobs       = desc("alkblobfs_namespace_blobs", "Blobs a namespace links.", "namespace")
	descNSUniqueBytes = desc("alkblobfs_namespace_unique_bytes", "Bytes of the blobs only this namespace links: what sweeps would free if it went.", "namespace")
	descNSQuotaBytes  = desc("alkblobfs_namespace_quota_bytes", "A namespace's byte quota (absent: no limit).", "namespace")
	descNSQuotaBlobs  = desc("alkblobfs_namespace_quota_blobs", "A namespace's blob quota (absent: no limit).", "namespace")
)

// nsCollector reports the usage of the namespaces one caller may search
// (and, for a token bound to namespaces, names), at one scrape.
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
	seen := 0
	for ns, err := range n.s.ns.Names(n.ctx, "") {
		if err != nil {
			n.s.log.Warn("metrics: listing the namespaces for their usage", "err", err)
			return
		}
		if !n.c.bound(ns) {
			continue
		}
		p, err := n.s.perm(n.ctx, ns)
		if err != nil || namespaces.Allowed(p, n.c.Principal, namespaces.Search) != nil {
			continue // removed meanwhile, or not the caller's to see
		}
		if seen++; seen > maxNamespaceSeries {
			n.s.log.Warn("metrics: reporting the usage of the first namespaces only", "most", maxNamespaceSeries)
			return
		}
		u, err := n.s.ns.Usage(n.ctx, ns)
		if errors.Is(err, namespaces.ErrNotFound) {
			continue // removed since it was listed
		}
		if err != nil {
			n.s.log.Warn("metrics: reading a namespace's usage", "namespace", ns, "err", err)
			continue
		}
		gauge(descNSBytes, u.Bytes, ns)
		gauge(descNSBlobs, u.Blobs, ns)
		gauge(descNSUniqueBytes, u.UniqueBytes, ns)
		if u.Quota.Bytes > 0 {
			gauge(descNSQuotaBytes, u.Quota.Bytes, ns)
		}
		if u.Quota.Blobs > 0 {
			gauge(descNSQuotaBlobs, u.Quota.Blobs, ns)
		}
	}
}
