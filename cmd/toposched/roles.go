package main

import (
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/authcallout"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/policies"
	"github.com/toposched/toposched/services/analysis"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/optimizer"
	"github.com/toposched/toposched/services/placement"
)

// The roles of toposched's NATS users: one identity per part, each allowed
// its own part and nothing more (docs/security.md). Subjects carry whose
// part an event is (events.Scope), so that the server itself checks it:
//
//   - operator: the services of one process (toposched serve): everything.
//   - analysis, placement, optimizer, discovery: one service each (the
//     Helm chart's Deployments): everything but the events the others
//     write, so that only placement writes decisions, terms and releases.
//   - launcher: an administrator's topoctl and launchers: submits,
//     finishes and moves jobs of every tenant; no node's reports.
//   - tenant-<tenant>: a tenant's users: submit, finish and move their
//     tenant's jobs, and report their telemetry.
//   - agent-<node>: one node's agent: that node's topology, health,
//     heartbeats, rank logs and exits, the finishes of the jobs whose
//     rank 0 it runs (placement checks that part) and their telemetry.
//   - kube: the Kubernetes service (toposched kube): submits and finishes
//     the jobs of every tenant (Kubernetes RBAC says who may create
//     pods), publishes the GPUs held outside toposched, and campaigns for
//     its lease.
//   - slurm: the Slurm sync service (toposched slurm-sync): publishes the
//     GPUs Slurm gave to jobs not toposched's, finishes the jobs whose
//     Slurm job ended, and campaigns for its lease.
//   - policy-admin: topoctl policy push and calibration push.
//   - auth-callout: toposched kube's answers to the NATS servers' auth
//     callout (internal/authcallout), in an account of its own: it reads
//     the requests and sends the answers, nothing of toposched's.
//
// The readers (launcher, tenants, agents) read the streams through
// ordered consumers and gets, and can neither manage a stream nor touch a
// service's durable consumer.
const (
	roleOperator    = "operator"
	roleLauncher    = "launcher"
	rolePolicyAdmin = "policy-admin"
	roleAuthCallout = "auth-callout"
)

// fixedRoles are the roles without a name, in the order they are listed.
var fixedRoles = append([]string{roleOperator, roleLauncher, rolePolicyAdmin}, serviceNames...)

// serviceNames are the roles of one service each.
var serviceNames = append(slices.Clone(operator.All), roleKube, roleSlurm)

// durable is one durable consumer a service reads through.
type durable struct {
	domain events.Domain
	name   string
}

// serviceDurables are the durable consumers of each service, by the
// services' own constants: what readiness checks and what the readers
// may never touch. TestServiceDurablesAreTheConsumers compares them with
// the consumers the services create.
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

// publishedBy names the services that write each event the services
// write; the others are their users' and agents'. A service role may
// publish none of the events another service owns.
// TestPublishedByCoversTheServices checks each service's role lets it
// publish what it does.
var publishedBy = map[events.Name][]string{
	events.NameJobAnalyzed:               {operator.Analysis},
	events.NamePlacementRejected:         {operator.Analysis, operator.Placement},
	events.NamePlacementDecided:          {operator.Placement},
	events.NamePlacementPending:          {operator.Placement},
	events.NamePlacementReleased:         {operator.Placement},
	events.NamePlacementTerm:             {operator.Placement},
	events.NamePlacementFinishRefused:    {operator.Placement},
	events.NamePlacementMigrationRefused: {operator.Placement},
	events.NameJobFinished:               {operator.Placement, roleKube, roleSlurm}, // the watchdog's lost jobs; pods ended; Slurm jobs ended
	events.NamePlacementMigration:        {operator.Optimizer},
	events.NameRuntimeTuning:             {operator.Optimizer},
	events.NameRuntimeDiagnosis:          {operator.Optimizer},
	events.NameTopologyNode:              {operator.Discovery},
	events.NameTopologyFabric:            {operator.Discovery, roleKube}, // the cluster file's, or the node labels' tree

	events.NameTopologyHealth:       {operator.Discovery},
	events.NameTopologyHeld:         {roleKube, roleSlurm},
	events.NamePolicyApplied:        {operator.Placement, operator.Optimizer},
	events.NamePolicyRejected:       {operator.Placement, operator.Optimizer},
	events.NameCalibrationApplied:   {operator.Placement, operator.Optimizer},
	events.NameCalibrationRejected:  {operator.Placement, operator.Optimizer},
	events.NameJobSubmitted:         {roleKube},
	events.NameJobMigrationAccepted: nil,
	events.NameRuntimeTelemetry:     nil,
	events.NameAgentHeartbeat:       nil,
	events.NameRankLog:              nil,
	events.NameRanksExited:          nil,
}

// roles are the roles of one subject prefix.
type roles struct{ prefix string }

// permissions gives a role's permissions (nil: everything), or ok false
// for a name that is no role.
func (r roles) permissions(role string) (*server.Permissions, bool) {
	switch role {
	case roleOperator:
		return nil, true
	case roleLauncher:
		return r.launcher(), true
	case rolePolicyAdmin:
		return r.policyAdmin(), true
	case roleAuthCallout:
		return authCalloutPermissions(), true
	}
	if slices.Contains(serviceNames, role) {
		return r.service(role), true
	}
	switch s, _ := events.ScopeOfRole(role); s.Kind {
	case events.ScopeNode:
		return r.agent(s.Name), true
	case events.ScopeTenant:
		return r.tenant(s.Name), true
	}
	return nil, false
}

// streamName is bus.(*Bus).StreamName without a bus: the credentials are
// made before the server that the bus connects to starts
// (TestStreamNameIsTheBus's).
func streamName(prefix string, d events.Domain) string {
	return strings.ToUpper(strings.NewReplacer("-", "_").Replace(prefix) + "_" + string(d))
}

// readerStreams are the streams the readers read: decisions, tuning, jobs,
// topology, policy answers, the agents' heartbeats; never the dead
// letters.
var readerStreams = []events.Domain{events.DomainJobs, events.DomainPlacement, events.DomainRuntime, events.DomainTopology, events.DomainPolicy, events.DomainAgent}

// reads are what a reader publishes to read: JetStream's API for ordered
// consumers and gets on readerStreams and the KV buckets' gets.
//
// JetStream's consumer create subject is $JS.API.CONSUMER.CREATE.<stream>.
// <name>[.<filter>] for an ephemeral or a durable alike, and NATS
// wildcards match whole tokens, so a reader's ordered consumers (random
// names) are allowed with a wildcard and each service durable is denied
// by name (denies); deny wins over allow. The legacy forms that take the
// name from the request body ($JS.API.CONSUMER.CREATE.<stream>,
// $JS.API.CONSUMER.DURABLE.CREATE.<stream>.<name>) are not allowed at all.
// Ordered consumers acknowledge nothing, so no $JS.ACK subject either.
func (r roles) reads() []string {
	allow := []string{"$JS.API.INFO"}
	for _, d := range readerStreams {
		s := streamName(r.prefix, d)
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
	for _, bucket := range []string{policies.BucketName(r.prefix), calibration.BucketName(r.prefix)} {
		kv := "KV_" + bucket
		allow = append(allow, "$JS.API.STREAM.INFO."+kv, "$JS.API.DIRECT.GET."+kv+".>")
	}
	return allow
}

// denies are what no reader may publish, whatever its allows say: the
// domains of the services' events but those given, stream management,
// the KV buckets' writes, the dead letters, and the services' durable
// consumers (no create, which would update one; no delete; no pull,
// which would take its messages).
func (r roles) denies(except ...events.Domain) []string {
	subj := events.NewSubjects(r.prefix)
	var deny []string
	for _, d := range []events.Domain{events.DomainPlacement, events.DomainTopology, events.DomainPolicy} {
		if !slices.Contains(except, d) {
			deny = append(deny, subj.Domain(d))
		}
	}
	deny = append(deny,
		subj.DeadLetter(),
		subj.DeadLetter()+".>",
		"$KV.>",
		"$JS.API.STREAM.CREATE.>",
		"$JS.API.STREAM.UPDATE.>",
		"$JS.API.STREAM.DELETE.>",
		"$JS.API.STREAM.PURGE.>",
		"$JS.API.STREAM.MSG.DELETE.>",
		"$JS.API.CONSUMER.DURABLE.>",
	)
	for _, name := range durableNames() {
		deny = append(deny,
			"$JS.API.CONSUMER.CREATE.*."+name,
			"$JS.API.CONSUMER.CREATE.*."+name+".>",
			"$JS.API.CONSUMER.DELETE.*."+name,
			"$JS.API.CONSUMER.MSG.NEXT.*."+name,
		)
	}
	return deny
}

// reader is a reader's permissions: publish allow and the reads, never
// deny.
func (r roles) reader(allow, deny []string) *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: append(allow, r.reads()...), Deny: deny},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
}

// userEvents are the events users publish about their jobs.
var userEvents = []events.Name{events.NameJobSubmitted, events.NameJobFinished, events.NameJobMigrationAccepted, events.NameRuntimeTelemetry}

// launcher is an administrator's role: the users' events bare and under
// every tenant, never under a node.
func (r roles) launcher() *server.Permissions {
	subj := events.NewSubjects(r.prefix)
	var allow []string
	for _, n := range userEvents {
		allow = append(allow, subj.Of(n), subj.Of(n)+"."+string(events.ScopeTenant)+".*")
	}
	return r.reader(allow, r.denies())
}

// tenant is a tenant's users' role: the users' events under their tenant.
func (r roles) tenant(name string) *server.Permissions {
	subj := events.NewSubjects(r.prefix)
	var allow []string
	for _, n := range userEvents {
		allow = append(allow, subj.Scoped(n, events.TenantScope(name)))
	}
	return r.reader(allow, r.denies())
}

// agent is one node's agent's role: what the node says of itself, and the
// finishes and telemetry of the jobs it runs, under its node.
func (r roles) agent(node string) *server.Permissions {
	subj := events.NewSubjects(r.prefix)
	scope := events.NodeScope(node)
	allow := []string{
		subj.Scoped(events.NameTopologyNode, scope),
		subj.Scoped(events.NameTopologyHealth, scope),
		subj.Scoped(events.NameAgentHeartbeat, scope),
		subj.Scoped(events.NameRankLog, scope),
		subj.Scoped(events.NameRanksExited, scope),
		subj.Scoped(events.NameJobFinished, scope),
		subj.Scoped(events.NameRuntimeTelemetry, scope),
	}
	return r.reader(allow, r.denies(events.DomainTopology))
}

// service is one service's role: everything but the events the other
// services own and the buckets it does not write.
func (r roles) service(svc string) *server.Permissions {
	subj := events.NewSubjects(r.prefix)
	var deny []string
	for _, n := range events.Catalogue {
		if slices.Contains(publishedBy[n], svc) {
			continue
		}
		deny = append(deny, subj.Of(n))
		if n.NodeScoped() || n.IdentityScoped() {
			// Of is the node wildcard of a node-scoped event; the
			// identity-scoped ones have their scopes below the name.
			deny = append(deny, strings.TrimSuffix(subj.Of(n), ".*")+".>")
		}
	}
	deny = append(deny, "$KV."+policies.BucketName(r.prefix)+".>")
	if svc != operator.Optimizer {
		deny = append(deny, "$KV."+calibration.BucketName(r.prefix)+".>") // the online calibration's
	}
	switch svc {
	case operator.Placement:
	case roleKube, roleSlurm:
		// Its own lease only.
		deny = append(deny, "$KV."+operator.LeaseBucket(r.prefix)+"."+operator.LeaseKey)
	default:
		deny = append(deny, "$KV."+operator.LeaseBucket(r.prefix)+".>")
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
		Subscribe: &server.SubjectPermission{Allow: []string{">"}},
	}
}

// policyAdmin is topoctl policy push's and calibration push's role: the
// policy and calibration buckets (create them if missing, put, read,
// watch) and the policy stream's answers.
func (r roles) policyAdmin() *server.Permissions {
	allow := []string{"$JS.API.INFO", "$JS.FC.>"}
	for _, bucket := range []string{policies.BucketName(r.prefix), calibration.BucketName(r.prefix)} {
		kv := "KV_" + bucket
		allow = append(allow,
			"$KV."+bucket+".>",
			"$JS.API.STREAM.INFO."+kv,
			"$JS.API.STREAM.CREATE."+kv,
			"$JS.API.STREAM.MSG.GET."+kv,
			"$JS.API.DIRECT.GET."+kv,
			"$JS.API.DIRECT.GET."+kv+".>",
			"$JS.API.CONSUMER.CREATE."+kv,
			"$JS.API.CONSUMER.CREATE."+kv+".>",
			"$JS.API.CONSUMER.DELETE."+kv+".>",
		)
	}
	s := streamName(r.prefix, events.DomainPolicy)
	allow = append(allow,
		"$JS.API.STREAM.INFO."+s,
		"$JS.API.CONSUMER.CREATE."+s,
		"$JS.API.CONSUMER.CREATE."+s+".>",
		"$JS.API.CONSUMER.MSG.NEXT."+s+".>",
		"$JS.API.CONSUMER.DELETE."+s+".>",
	)
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: allow},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
}

// authCalloutPermissions are the auth callout responder's: the servers'
// requests, and the answers to their reply subjects ($SYS._INBOX.<server>.
// <id>, the servers' own inboxes in the callout account). The servers add
// a deny of the request subject to every user of the callout account.
func authCalloutPermissions() *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"$SYS._INBOX.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{authcallout.Subject}},
	}
}

// agentRole is node's agent's role name and permissions, for the auth
// callout's users.
func (r roles) agentRole(node string) (string, *server.Permissions, error) {
	role, err := events.NodeScope(node).Role()
	if err != nil {
		return "", nil, err
	}
	return role, r.agent(node), nil
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

// servedRoles are the roles toposched serve keeps a seed for in its
// credentials directory from its first start: its services' (operator),
// an administrator's (launcher) and the policy pusher's. Agents and
// tenants are issued (toposched roles issue).
func servedRoles(prefix string) []natsserver.Role {
	r := roles{prefix}
	var out []natsserver.Role
	for _, role := range []string{roleOperator, roleLauncher, rolePolicyAdmin} {
		p, _ := r.permissions(role)
		out = append(out, natsserver.Role{Name: role, Permissions: p})
	}
	return out
}
