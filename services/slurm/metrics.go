package slurm

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the Slurm sync service's own series; the events it
// publishes are counted by the bus's observer like every service's.
type Metrics struct {
	readFailures prometheus.Counter
	mismatches   prometheus.Counter
	finished     prometheus.Counter
}

// NewMetrics registers the service's series with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		readFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "toposched_slurm_squeue_failures_total", Help: "Polls of squeue --json that failed (slurmctld down, squeue missing, output unreadable); nothing is published from them.",
		}),
		mismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "toposched_slurm_placement_mismatches_total", Help: "toposched jobs that Slurm runs on other nodes or GPUs than placement decided (each counted once).",
		}),
		finished: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "toposched_slurm_jobs_finished_total", Help: "toposched jobs this service finished because their Slurm job ended.",
		}),
	}
	reg.MustRegister(m.readFailures, m.mismatches, m.finished)
	return m
}

func (m *Metrics) readFailed() {
	if m != nil {
		m.readFailures.Inc()
	}
}

func (m *Metrics) mismatched() {
	if m != nil {
		m.mismatches.Inc()
	}
}

func (m *Metrics) jobFinished() {
	if m != nil {
		m.finished.Inc()
	}
}
