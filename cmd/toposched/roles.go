package main

import (
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/policies"
	"github.com/toposched/toposched/services/analysis"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/optimizer"
	"github.com/toposched/toposched/services/placement"
)

// The roles of the credentials serve generates for an embedded server that
// listens beyond loopback; deploy/nats/auth.conf defines the same roles
// for a NATS deployment (TestShippedLauncherRoleIsGenerated keeps the
// launcher's the same).
const (
	roleOperator = "operator"
	roleLauncher = "launcher"
	roleAgent    = "agent"
)

// durable is one durable consumer a service reads through.
type durable struct {
	domain events.Domain
	name   string
}

// serviceDurables are the durable consumers of each service, by the
// services' own constants: what readiness checks and what launchers may
// never touch. TestServiceDurablesAreTheConsumers compares them with the
// consumers the services create.
var serviceDurables = map[string][]durable{
	operator.Analysis: {{events.DomainJobs, analysis.HandlerSubmitted}},
	operator.Placement: {
		{events.DomainJobs, placement.HandlerAnalyzed},
		{events.DomainJobs, placement.HandlerFinished},
		{events.DomainJobs, placement.HandlerMigrate},
		{events.DomainTopology, placement.HandlerTopology},
	},
	operator.Optimizer: {
		{events.DomainJobs, optimizer.HandlerAnalyzed},
		{events.DomainPlacement, optimizer.HandlerPlacement},
		{events.DomainTopology, optimizer.HandlerTopology},
		{events.DomainRuntime, optimizer.HandlerTelemetry},
	},
}

// streamName is bus.(*Bus).StreamName without a bus: the credentials are
// made before the server that the bus connects to starts
// (TestStreamNameIsTheBus's).
func streamName(prefix string, d events.Domain) string {
	return strings.ToUpper(strings.NewReplacer("-", "_").Replace(prefix) + "_" + string(d))
}

// launcherReads are the streams a launcher reads: decisions, tuning,
// jobs, topology, policy answers, the agents' heartbeats; never the dead
// letters.
var launcherReads = []events.Domain{events.DomainJobs, events.DomainPlacement, events.DomainRuntime, events.DomainTopology, events.DomainPolicy, events.DomainAgent}

// launcherPermissions is the launcher role (deploy/nats/auth.conf's
// LAUNCHER_PERMS for the default prefix): it publishes jobs.submitted,
// jobs.finished, jobs.migration_accepted, runtime.telemetry and what a
// node agent that launches ranks says (agent.heartbeat.<node>,
// runtime.rank_log, runtime.ranks_exited: toposched agent --exec signs in
// as a launcher), and reads
// the streams of launcherReads through ordered consumers and gets. It
// manages no stream and cannot create, edit, delete or pull from a
// service's durable consumer.
//
// JetStream's consumer create subject is $JS.API.CONSUMER.CREATE.<stream>.
// <name>[.<filter>] for an ephemeral or a durable alike, and NATS
// wildcards match whole tokens, so a launcher's ordered consumers (random
// names) are allowed with a wildcard and each service durable is denied
// by name; deny wins over allow. The legacy forms that take the name from
// the request body ($JS.API.CONSUMER.CREATE.<stream>,
// $JS.API.CONSUMER.DURABLE.CREATE.<stream>.<name>) are not allowed at all.
// Ordered consumers acknowledge nothing, so no $JS.ACK subject either.
func launcherPermissions(prefix string) *server.Permissions {
	subj := events.NewSubjects(prefix)
	allow := []string{
		subj.Of(events.NameJobSubmitted),
		subj.Of(events.NameJobFinished),
		subj.Of(events.NameJobMigrationAccepted),
		subj.Of(events.NameRuntimeTelemetry),
		subj.Of(events.NameAgentHeartbeat),
		subj.Of(events.NameRankLog),
		subj.Of(events.NameRanksExited),
		"$JS.API.INFO",
	}
	for _, d := range launcherReads {
		s := streamName(prefix, d)
		allow = append(allow,
			"$JS.API.STREAM.INFO."+s,
			"$JS.API.STREAM.MSG.GET."+s,
			"$JS.API.DIRECT.GET."+s,
			"$JS.API.DIRECT.GET."+s+".>",
			"$JS.API.CONSUMER.CREATE."+s+".*",
			"$JS.API.CONSUMER.CREATE."+s+".*.>",
			"$JS.API.CONSUMER.INFO."+s+".*",
			"$JS.API.CONSUMER.MSG.NEXT."+s+".*",
			"$JS.API.CONSUMER.DELETE."+s+".*",
		)
	}
	for _, bucket := range []string{policies.BucketName(prefix), calibration.BucketName(prefix)} {
		kv := "KV_" + bucket
		allow = append(allow, "$JS.API.STREAM.INFO."+kv, "$JS.API.DIRECT.GET."+kv+".>")
	}

	deny := []string{
		subj.Domain(events.DomainPlacement),
		subj.Domain(events.DomainTopology),
		subj.Domain(events.DomainPolicy),
		subj.DeadLetter(),
		subj.DeadLetter() + ".>",
		"$KV.>",
		"$JS.API.STREAM.CREATE.>",
		"$JS.API.STREAM.UPDATE.>",
		"$JS.API.STREAM.DELETE.>",
		"$JS.API.STREAM.PURGE.>",
		"$JS.API.STREAM.MSG.DELETE.>",
		"$JS.API.CONSUMER.DURABLE.>",
	}
	for _, name := range durableNames() {
		deny = append(deny,
			"$JS.API.CONSUMER.CREATE.*."+name,
			"$JS.API.CONSUMER.CREATE.*."+name+".>",
			"$JS.API.CONSUMER.DELETE.*."+name,
			"$JS.API.CONSUMER.MSG.NEXT.*."+name,
		)
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: allow, Deny: deny},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
}

// durableNames are every service's durable consumer names, in a fixed
// order, each once.
func durableNames() []string {
	var out []string
	seen := map[string]bool{}
	for _, svc := range operator.All {
		for _, d := range serviceDurables[svc] {
			if !seen[d.name] {
				seen[d.name] = true
				out = append(out, d.name)
			}
		}
	}
	return out
}

// agentPermissions is the node agents' role of the generated credentials:
// any node's topology and health, nothing else. (auth.conf has one user
// per node, bound to its own node's subjects; one generated key for every
// agent cannot be.)
func agentPermissions(prefix string) *server.Permissions {
	subj := events.NewSubjects(prefix)
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{subj.Of(events.NameTopologyNode), subj.Of(events.NameTopologyHealth)}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
}

// generatedRoles are the users of the generated credentials: the services
// (everything), launchers and node agents.
func generatedRoles(prefix string) []natsserver.Role {
	return []natsserver.Role{
		{Name: roleOperator},
		{Name: roleLauncher, Permissions: launcherPermissions(prefix)},
		{Name: roleAgent, Permissions: agentPermissions(prefix)},
	}
}
