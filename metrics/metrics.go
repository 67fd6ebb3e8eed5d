// Package metrics exposes an operator's Prometheus metrics and its health
// and readiness endpoints.
//
// The services are not edited to count things: the bus reports every
// handled delivery and every published event to an Observer (events/bus),
// placement reports each policy evaluation's time (PolicyEvaluated, given
// to it as its ObservePolicyEval), and the placement store and the lease
// are read through a Stats function when Prometheus scrapes (Watch): the
// wiring fills it, so this package imports no service.
// So a decision is counted when placement.decided is stored, whichever code
// path made it, and a metric can never disagree with the stream.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// Metrics is one process's registry.
type Metrics struct {
	reg *prometheus.Registry

	published       *prometheus.CounterVec
	decisions       prometheus.Counter
	rejections      prometheus.Counter
	pendings        prometheus.Counter
	decisionLatency prometheus.Histogram
	handlerDuration *prometheus.HistogramVec
	handlerErrors   *prometheus.CounterVec
	redeliveries    *prometheus.CounterVec
	policyEval      prometheus.Histogram
}

// New returns a registry with the Go runtime's and the process's
// collectors and every toposched series.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.published = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "toposched_events_published_total", Help: "Events this process stored in JetStream, by event name.",
	}, []string{"event"})
	m.decisions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "toposched_placement_decisions_total", Help: "placement.decided events published: jobs placed (migrations included).",
	})
	m.rejections = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "toposched_placement_rejections_total", Help: "placement.rejected events published: jobs that can never fit or are invalid.",
	})
	m.pendings = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "toposched_placement_pending_total", Help: "placement.pending events published: jobs put in the queue.",
	})
	m.decisionLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "toposched_placement_decision_latency_seconds",
		Help: "From the event that caused a decision (the job's analysis, or the release or topology change that made room) to the decision's PubAck.",
		// 1 ms to about 33 s.
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	m.handlerDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "toposched_handler_duration_seconds", Help: "Time a handler took for one delivery, retries included, by durable consumer.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"handler"})
	m.handlerErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "toposched_handler_errors_total", Help: "Deliveries a handler failed (dead-lettered if permanent, redelivered later if transient), by durable consumer.",
	}, []string{"handler"})
	m.redeliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "toposched_handler_redeliveries_total", Help: "Deliveries JetStream made more than once (after a nack, a crash or AckWait), by durable consumer.",
	}, []string{"handler"})
	m.policyEval = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "toposched_policy_evaluation_seconds", Help: "Time of one Rego evaluation (a node or a placement document; cached node verdicts are not evaluations).",
		Buckets: prometheus.ExponentialBuckets(0.00001, 2.5, 14),
	})
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.published, m.decisions, m.rejections, m.pendings, m.decisionLatency,
		m.handlerDuration, m.handlerErrors, m.redeliveries, m.policyEval)
	return m
}

// Registry is the registry, to add series or gather in tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

var _ bus.Observer = (*Metrics)(nil)

// Handled counts one delivery (bus.Observer).
func (m *Metrics) Handled(handler string, took time.Duration, err error, delivered uint64) {
	m.handlerDuration.WithLabelValues(handler).Observe(took.Seconds())
	// Getting the children creates them: every handler's counters show,
	// at 0 until something goes wrong, so a rate() has a series to read.
	errs, again := m.handlerErrors.WithLabelValues(handler), m.redeliveries.WithLabelValues(handler)
	if err != nil {
		errs.Inc()
	}
	if delivered > 1 {
		again.Inc()
	}
}

// Published counts one stored event (bus.Observer); a decision's latency is
// measured from the event being handled when it was made.
func (m *Metrics) Published(ctx context.Context, name events.Name, _ events.Envelope) {
	m.published.WithLabelValues(string(name)).Inc()
	switch name {
	case events.NamePlacementDecided:
		m.decisions.Inc()
		if cause, ok := bus.CauseFrom(ctx); ok && !cause.Time.IsZero() {
			m.decisionLatency.Observe(max(time.Since(cause.Time), 0).Seconds())
		}
	case events.NamePlacementRejected:
		m.rejections.Inc()
	case events.NamePlacementPending:
		m.pendings.Inc()
	}
}

// PolicyEvaluated records one evaluation's time: give it to placement as
// its ObservePolicyEval.
func (m *Metrics) PolicyEvaluated(d time.Duration) { m.policyEval.Observe(d.Seconds()) }

// Stats is what the running services report at scrape time. The wiring
// fills it; metrics knows nothing of the wiring.
type Stats struct {
	// LeaseKnown says this process campaigns for placement's lease;
	// Leader whether it holds it, Terms how many terms it has led.
	LeaseKnown bool
	Leader     bool
	Terms      int
	// StoreKnown says this process leads placement and the store figures
	// below are its store's.
	StoreKnown bool
	Nodes      int
	GPUs       int // on the cluster's nodes
	HealthyGPU int
	FreeGPUs   int
	// Jobs counts the store's jobs by state (pending, placed, ...).
	Jobs map[string]int
	// RebuildIgnored counts the placement events the leader's rebuild
	// left out, by reason (unfenced, conflict).
	RebuildIgnored map[string]int
}

// Watch adds the series read from stats when scraped: the placement
// store's size and queue depth (on the leader), and the lease.
func (m *Metrics) Watch(stats func() Stats) {
	m.reg.MustRegister(&statsCollector{stats: stats})
}

var (
	descPending = prometheus.NewDesc("toposched_placement_pending_jobs",
		"Jobs waiting in placement's queue (on the leading replica).", nil, nil)
	descJobs = prometheus.NewDesc("toposched_store_jobs",
		"Jobs in placement's store, by state (on the leading replica).", []string{"state"}, nil)
	descNodes = prometheus.NewDesc("toposched_store_nodes", "Nodes in placement's store.", nil, nil)
	descGPUs  = prometheus.NewDesc("toposched_store_gpus",
		"GPUs in placement's store: all on the cluster's nodes, healthy, free.", []string{"kind"}, nil)
	descLeader = prometheus.NewDesc("toposched_placement_leader",
		"1 while this replica holds placement's lease and applies decisions, 0 on a standby.", nil, nil)
	descTerms = prometheus.NewDesc("toposched_placement_leader_terms_total",
		"Terms this replica has led (each began with a rebuild from the streams).", nil, nil)
	descIgnored = prometheus.NewDesc("toposched_placement_rebuild_ignored_events",
		"Placement events the leader's rebuild did not take in: unfenced (no placement term wrote them) or conflict (GPUs another job holds).",
		[]string{"reason"}, nil)
)

// statsCollector reads the services at scrape time.
type statsCollector struct{ stats func() Stats }

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPending, descJobs, descNodes, descGPUs, descLeader, descTerms, descIgnored} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	if st.LeaseKnown {
		v := 0.0
		if st.Leader {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, v)
		ch <- prometheus.MustNewConstMetric(descTerms, prometheus.CounterValue, float64(st.Terms))
	}
	if !st.StoreKnown {
		return
	}
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(st.Jobs["pending"]))
	for state, n := range st.Jobs {
		ch <- prometheus.MustNewConstMetric(descJobs, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(st.Nodes))
	ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(st.GPUs), "total")
	ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(st.HealthyGPU), "healthy")
	ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(st.FreeGPUs), "free")
	// placement.IgnoredUnfenced and IgnoredConflict, always shown.
	for _, reason := range []string{"unfenced", "conflict"} {
		ch <- prometheus.MustNewConstMetric(descIgnored, prometheus.GaugeValue, float64(st.RebuildIgnored[reason]), reason)
	}
}

// Handler serves /metrics, /healthz (the process answers) and /readyz
// (ready() returns nil; otherwise 503 with its error).
func (m *Metrics) Handler(ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ready")
	})
	return mux
}

// Server is a running metrics endpoint.
type Server struct {
	srv  *http.Server
	addr net.Addr
	done chan error
}

// Listen serves h on addr (HOST:PORT; port 0 picks one) until Close.
func Listen(addr string, h http.Handler, log *slog.Logger) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	s := &Server{srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, addr: l.Addr(), done: make(chan error, 1)}
	go func() {
		err := s.srv.Serve(l)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if err != nil && log != nil {
			log.Error("metrics endpoint stopped", "err", err)
		}
		s.done <- err
	}()
	return s, nil
}

// Addr is where the server listens.
func (s *Server) Addr() net.Addr { return s.addr }

// Close stops the server, letting requests in flight finish for a moment.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	return errors.Join(err, <-s.done)
}
