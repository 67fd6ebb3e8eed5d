# Tenant isolation by node labels.
#
# A node labelled `tenant` belongs to that tenant: only its jobs may use it.
# Unlabelled nodes are shared.
package toposched.nodes.tenant_isolation

deny contains v if {
	owner := input.node.labels.tenant
	owner != input.job.tenant
	v := {
		"code": "tenant_mismatch",
		"msg": sprintf("node %s is reserved for tenant '%s', the job's tenant is '%s'", [input.node.name, owner, input.job.tenant]),
	}
}
