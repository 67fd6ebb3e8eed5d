package events

// Domain is the second subject token of an event, "<prefix>.<domain>.<event>",
// and names the JetStream stream that holds it: one stream per domain, so
// that each can keep its own retention (see bus.Bus.StreamName). It is a
// named type so that a stream is never picked by a stray string; untyped
// string constants still convert to it.
type Domain string

// The stream domains. Every event name's domain is one of the first six
// (Name.Domain); DomainDLQ holds no event type of its own.
const (
	// DomainJobs holds what users and launchers say about jobs: submitted,
	// analysed, finished, migration accepted.
	DomainJobs Domain = "jobs"
	// DomainPlacement holds placement's decisions, waits, rejections and
	// releases: the ordered log of allocations that a replica rebuilds from.
	DomainPlacement Domain = "placement"
	// DomainTopology holds node reports, the fabric and health changes.
	DomainTopology Domain = "topology"
	// DomainPolicy is the audit trail of policy sets applied and refused.
	DomainPolicy Domain = "policy"
	// DomainRuntime holds the optimizer's tuning and diagnoses and the
	// jobs' telemetry.
	DomainRuntime Domain = "runtime"
	// DomainAgent holds the newest heartbeat of each node agent that
	// launches ranks: a registry, not a log.
	DomainAgent Domain = "agent"
	// DomainDLQ keeps the messages no handler could take (the dead-letter
	// subject, Subjects.DeadLetter), with the error beside each.
	DomainDLQ Domain = "dlq"
)

// Domains lists every stream domain, in the order the streams are created.
var Domains = []Domain{DomainJobs, DomainPlacement, DomainTopology, DomainPolicy, DomainRuntime, DomainAgent, DomainDLQ}

// String returns the domain's subject token.
func (d Domain) String() string { return string(d) }
