package kube

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Kubernetes service's own series; the events it
// publishes are counted by the bus's observer like every service's. One
// Metrics outlives the terms of the lease: each term's Service reports to
// it.
type Metrics struct {
	gangsBound  prometheus.Counter
	podsBound   prometheus.Counter
	bindLatency prometheus.Histogram
	givenUp     *prometheus.CounterVec
	leading     prometheus.Gauge
	queueDepth  prometheus.GaugeFunc
	// depth is the running term's queue length.
	depth atomic.Pointer[func() int]
}

// NewMetrics registers the service's series with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{}
	m.gangsBound = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "toposched_kube_gangs_bound_total", Help: "Gangs whose every pod this service bound.",
	})
	m.podsBound = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "toposched_kube_pods_bound_total", Help: "Pods this service bound.",
	})
	m.bindLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "toposched_kube_bind_latency_seconds",
		Help: "From placement's decision (decided_at) to the gang's last pod bound.",
		// 1 ms to about 33 s.
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	m.givenUp = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "toposched_kube_decisions_given_up_total",
		Help: "Decisions that could not be carried out and were undone: resubmitted (a GPU another claim kept) or not (the pods' claims cannot be met).",
	}, []string{"resubmitted"})
	m.leading = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "toposched_kube_leading", Help: "1 while this replica holds the lease and schedules pods, 0 on a standby.",
	})
	m.queueDepth = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "toposched_kube_queue_depth", Help: "Gangs, jobs, nodes and claims waiting to be looked at.",
	}, func() float64 {
		if f := m.depth.Load(); f != nil {
			return float64((*f)())
		}
		return 0
	})
	reg.MustRegister(m.gangsBound, m.podsBound, m.bindLatency, m.givenUp, m.leading, m.queueDepth)
	return m
}

// SetLeading records whether this replica leads.
func (m *Metrics) SetLeading(on bool) {
	if m == nil {
		return
	}
	if on {
		m.leading.Set(1)
	} else {
		m.leading.Set(0)
	}
}

func (m *Metrics) bound(pods int, decidedAt time.Time) {
	if m == nil {
		return
	}
	m.gangsBound.Inc()
	m.podsBound.Add(float64(pods))
	if !decidedAt.IsZero() {
		m.bindLatency.Observe(max(time.Since(decidedAt), 0).Seconds())
	}
}

func (m *Metrics) gaveUp(resubmitted bool) {
	if m == nil {
		return
	}
	if resubmitted {
		m.givenUp.WithLabelValues("true").Inc()
	} else {
		m.givenUp.WithLabelValues("false").Inc()
	}
}
