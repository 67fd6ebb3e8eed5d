package operator

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/kvwatch"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/topology"
)

// Which calibration the cost model predicts with.
//
// A replica's base is its --calibration file, or the documented
// efficiencies; the set in the calibration KV bucket (topoctl calibration
// push, or the optimizer's online moves) overrides it while there is one,
// and withdrawing it (deleting the key) falls back to the base. Unlike
// policy sets, a file's modification time does not compete with the push:
// the bucket is the cluster's one calibration, and a file is what a replica
// runs with until the cluster has one. Every set is checked before it is
// used; a refused one is announced with policy.calibration_rejected naming
// its lines, and the set in force stays. A set put in force is announced
// with policy.calibration_applied, one per replica.
type calibrationLoop struct {
	b        *bus.Bus
	kv       jetstream.KeyValue
	follow   *kvwatch.Follower[collective.Calibration]
	targets  []bandwidthTarget
	services []string
	log      *slog.Logger
	replica  string
	boot     string

	mu      sync.Mutex
	base    calibrationSet
	pushed  *calibrationSet
	inForce *calibrationSet
}

// bandwidthTarget is what predicts with the calibration in force.
type bandwidthTarget interface {
	SetBandwidths(*topology.Bandwidths)
}

// calibrationSet is a valid set and where it came from.
type calibrationSet struct {
	cal      *collective.Calibration // nil: the documented efficiencies
	revision string
	source   string
	kvRev    uint64
}

func (c *calibrationSet) name() string {
	switch {
	case c.cal == nil:
		return "default"
	case c.cal.Name == "":
		return "unnamed"
	}
	return c.cal.Name
}

// startCalibration puts the set in force before any service predicts and
// leaves the bucket watched until runCtx ends. It returns the loop, whose
// InForce and Push the optimizer's online calibration uses.
func startCalibration(ctx, runCtx context.Context, b *bus.Bus, targets []bandwidthTarget, services []string, cfg Config, log *slog.Logger, wg *sync.WaitGroup) (*calibrationLoop, error) {
	cl := &calibrationLoop{b: b, targets: targets, services: services, log: log.With("component", "calibration"),
		replica: replicaName(cfg), boot: bus.NewID()}
	cl.base = calibrationSet{cal: cfg.Calibration, revision: "default", source: events.CalibrationSourceDefault}
	if cfg.Calibration != nil {
		cl.base.revision, cl.base.source = cfg.CalibrationRevision, events.CalibrationSourceFile
	}
	err := bus.RetryJetStream(ctx, func(ctx context.Context) error {
		var err error
		cl.kv, err = calibration.EnsureKV(ctx, b.JetStream(), b.Subjects.Prefix, b.Replicas())
		return err
	})
	if err != nil {
		return nil, err
	}
	cl.follow = &kvwatch.Follower[collective.Calibration]{KV: cl.kv, Key: calibration.KVKey, Decode: calibration.DecodeValue,
		Lock: &cl.mu, Handler: cl, Log: cl.log}
	if err := cl.follow.Start(ctx, runCtx, wg); err != nil {
		return nil, err
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.settle(runCtx, "start:"+cl.boot)
	return cl, nil
}

// Offer takes a valid pushed set. cl.mu is held (kvwatch.Follower).
func (cl *calibrationLoop) Offer(ctx context.Context, trigger string, e calibration.Entry) {
	cl.pushed = &calibrationSet{cal: e.Set, revision: e.Revision, source: events.CalibrationSourceKV, kvRev: e.KVRevision}
	cl.pushedChanged(ctx, trigger)
}

// Withdraw takes the withdrawal of the pushed set. cl.mu is held.
func (cl *calibrationLoop) Withdraw(ctx context.Context, trigger string, e calibration.Entry) {
	cl.log.Info("calibration set withdrawn; back to the base", "kv_revision", e.KVRevision, "base", cl.base.name())
	cl.pushed = nil
	cl.pushedChanged(ctx, trigger)
}

// Refuse announces a refused value; the set in force stays. cl.mu is held.
func (cl *calibrationLoop) Refuse(ctx context.Context, trigger string, e calibration.Entry) {
	cl.reject(ctx, trigger, e)
}

// pushedChanged puts the winner in force after the pushed set changed,
// once start-up has settled. cl.mu is held.
func (cl *calibrationLoop) pushedChanged(ctx context.Context, trigger string) {
	if cl.inForce == nil {
		return // start-up settles once the value in force is in
	}
	cl.settle(ctx, trigger)
}

// settle puts the winner in force and announces it. cl.mu is held.
func (cl *calibrationLoop) settle(ctx context.Context, trigger string) {
	c := &cl.base
	if cl.pushed != nil {
		c = cl.pushed
	}
	if c == cl.inForce {
		return
	}
	prev := cl.inForce
	cl.inForce = c
	bw := c.cal.Bandwidths(nil)
	if c.cal == nil {
		bw = nil
	}
	for _, t := range cl.targets {
		t.SetBandwidths(bw)
	}
	eff := c.cal.Resolved()
	ev := &events.CalibrationApplied{Revision: c.revision, Name: c.name(), Source: c.source, KVRevision: c.kvRev,
		Efficiency: linkEfficiency(eff),
		Services:   cl.services, Replica: cl.replica, AppliedAt: time.Now().UTC()}
	if prev != nil {
		ev.Previous = prev.revision
	}
	if c.cal != nil && len(c.cal.Models) > 0 {
		bwm := c.cal.Bandwidths(nil)
		ev.Models = map[string]events.LinkEfficiency{}
		for model := range c.cal.Models {
			me := (&collective.Calibration{Efficiency: bwm.EfficiencyOf(model)}).Resolved()
			me.StepOverheadUS = eff.StepOverheadUS
			ev.Models[model] = linkEfficiency(me)
		}
	}
	if c.cal != nil && len(c.cal.Compute) > 0 {
		ev.Compute = map[string]float64{}
		for _, f := range c.cal.Compute {
			ev.Compute[f.Model] = f.Factor
		}
	}
	cl.log.Info("calibration in force", "name", ev.Name, "source", c.source, "kv_revision", c.kvRev,
		"revision", c.revision[:min(12, len(c.revision))], "efficiency", ev.Efficiency)
	cl.publish(ctx, trigger+"/"+cl.replica, c.revision, ev)
}

// reject announces a refused value; the set in force stays. cl.mu is held.
func (cl *calibrationLoop) reject(ctx context.Context, trigger string, e calibration.Entry) {
	ev := &events.CalibrationRejected{Revision: e.Revision, Name: "unknown", Source: events.CalibrationSourceKV,
		KVRevision: e.KVRevision, Replica: cl.replica, RejectedAt: time.Now().UTC()}
	if n := nameOfRaw(e.Raw); n != "" {
		ev.Name = n
	}
	in := cl.inForce
	if in == nil { // refused at start-up: the base will be in force
		in = &cl.base
	}
	ev.InForce = in.revision
	var errs collective.CalibrationErrors
	if errors.As(e.Err, &errs) {
		for _, ce := range errs {
			ev.Errors = append(ev.Errors, events.CalibrationError{Line: ce.Line, Field: ce.Field, Message: ce.Msg})
		}
	}
	if len(ev.Errors) == 0 {
		ev.Errors = []events.CalibrationError{{Message: e.Err.Error()}}
	}
	cl.log.Warn("calibration set refused; the set in force stays", "kv_revision", e.KVRevision,
		"in_force", in.name(), "err", e.Err)
	cl.publish(ctx, trigger, e.Revision, ev)
}

// publish sends an event whose id derives from cause, so that replicas
// refusing the same entry publish one event.
func (cl *calibrationLoop) publish(ctx context.Context, cause, revision string, ev any) {
	ctx = bus.WithCause(ctx, events.Envelope{ID: "calibration:" + cause, CorrelationID: revision})
	if _, err := cl.b.Publish(ctx, ev); err != nil && ctx.Err() == nil {
		cl.log.Error("publish calibration event", "revision", revision, "err", err)
	}
}

// InForce is the set in force (nil: the documented efficiencies) and its
// revision.
func (cl *calibrationLoop) InForce() (*collective.Calibration, string) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.inForce == nil {
		return cl.base.cal, cl.base.revision
	}
	return cl.inForce.cal, cl.inForce.revision
}

// Push puts an online move computed from the set of revision basedOn in
// the bucket, after the latest entry this replica has seen (a refused
// value or a withdrawal included, which the move replaces); it fails with
// calibration.ErrMoved when the set in force is no longer basedOn or
// another entry came first, so a move never overwrites a push it did not
// see.
func (cl *calibrationLoop) Push(ctx context.Context, c *collective.Calibration, basedOn string) (uint64, error) {
	cl.mu.Lock()
	in, after := cl.inForce, cl.follow.LastKV()
	cl.mu.Unlock()
	if in == nil || in.revision != basedOn {
		return 0, calibration.ErrMoved
	}
	return calibration.Update(ctx, cl.kv, c, after)
}

// nameOfRaw is a refused value's name, where it has one.
func nameOfRaw(raw []byte) string {
	var probe struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &probe) != nil {
		return ""
	}
	return probe.Name
}

// linkEfficiency is an efficiency as events carry it.
func linkEfficiency(e topology.Efficiency) events.LinkEfficiency {
	return events.LinkEfficiency{NVLink: e.NVLink, NVLS: e.NVLS, PCIe: e.PCIe, Net: e.Net, EFA: e.EFA, TCP: e.TCP, StepOverheadUS: e.StepOverheadUS, OpOverheadUS: e.OpOverheadUS}
}
