package cluster

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the agent's Prometheus metrics. A nil *Metrics records
// nothing, so tests and tools need not register any.
type Metrics struct {
	Registry   *prometheus.Registry
	desired    prometheus.Gauge
	ready      prometheus.Gauge
	fenced     prometheus.Gauge
	isLeader   prometheus.Gauge
	reconcile  prometheus.Histogram
	failoverS  prometheus.Histogram
	failovers  prometheus.Counter
	etcdErrors prometheus.Counter
	heldNodes  prometheus.Gauge
	failsafe   prometheus.Gauge
}

// NewMetrics registers the agent's metrics for node.
func NewMetrics(node string) *Metrics {
	l := prometheus.Labels{"node": node}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		desired: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nsfleet_namespaces_desired",
			Help: "Namespaces assigned to this node.", ConstLabels: l}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nsfleet_namespaces_ready",
			Help: "Assigned namespaces that match the spec on this node.", ConstLabels: l}),
		fenced: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nsfleet_fenced",
			Help: "1 while this node has stopped serving because its lease may have expired.", ConstLabels: l}),
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nsfleet_scheduler_leader",
			Help: "1 while this node's agent is the elected scheduler.", ConstLabels: l}),
		reconcile: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "nsfleet_reconcile_duration_seconds",
			Help: "Time of one reconcile pass (create, repair, tear down).", ConstLabels: l,
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}),
		failoverS: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "nsfleet_failover_duration_seconds",
			Help: "From a node's loss seen by the scheduler to all its namespaces ready elsewhere.", ConstLabels: l,
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 12)}),
		failovers: prometheus.NewCounter(prometheus.CounterOpts{Name: "nsfleet_failovers_total",
			Help: "Nodes lost whose namespaces this node's scheduler moved.", ConstLabels: l}),
		etcdErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "nsfleet_etcd_errors_total",
			Help: "Failed etcd requests.", ConstLabels: l}),
		heldNodes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nsfleet_failover_held_nodes",
			Help: "Lost nodes whose namespaces the scheduler leaves in place because more than half of the nodes are lost at once.", ConstLabels: l}),
		failsafe: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nsfleet_failsafe",
			Help: "1 while this node serves without its lease renewed because no node can reach etcd (failsafe).", ConstLabels: l}),
	}
	m.Registry.MustRegister(m.heldNodes, m.failsafe, m.desired, m.ready, m.fenced, m.isLeader, m.reconcile, m.failoverS, m.failovers, m.etcdErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (m *Metrics) counts(desired, ready int) {
	if m != nil {
		m.desired.Set(float64(desired))
		m.ready.Set(float64(ready))
	}
}
func (m *Metrics) setFenced(b bool) {
	if m != nil {
		m.fenced.Set(b2f(b))
	}
}
func (m *Metrics) leader(b bool) {
	if m != nil {
		m.isLeader.Set(b2f(b))
	}
}
func (m *Metrics) reconciled(s float64) {
	if m != nil {
		m.reconcile.Observe(s)
	}
}
func (m *Metrics) failover() {
	if m != nil {
		m.failovers.Inc()
	}
}
func (m *Metrics) failoverDone(s float64) {
	if m != nil {
		m.failoverS.Observe(s)
	}
}
func (m *Metrics) etcdError() {
	if m != nil {
		m.etcdErrors.Inc()
	}
}

func (m *Metrics) held(n int) {
	if m != nil {
		m.heldNodes.Set(float64(n))
	}
}

func (m *Metrics) setFailsafe(b bool) {
	if m != nil {
		m.failsafe.Set(b2f(b))
	}
}
