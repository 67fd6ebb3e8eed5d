# Keep whole nodes free for large jobs.
#
# A job smaller than a node that takes GPUs from a wholly free node breaks a
# node a large job could have used. While whole free nodes of that model are
# scarce (fewer than data.toposched.config.keep_whole_nodes.scarce_below,
# default 4) each such node adds a penalty (keep_whole_nodes.penalty,
# default 1) to the candidate's cost, and the candidate gets a warning.
package toposched.placement.keep_whole_nodes

default penalty := 1

penalty := data.toposched.config.keep_whole_nodes.penalty

default scarce_below := 4

scarce_below := data.toposched.config.keep_whole_nodes.scarce_below

# broken: the wholly free nodes this small job would break.
broken contains n.name if {
	some n in input.placement.nodes
	n.gpus_free == n.gpus_total
	input.job.gpus < n.gpus_total
	object.get(input.cluster.whole_free_nodes_by_model, n.gpu_model, 0) < scarce_below
}

score := penalty * count(broken)

warn contains v if {
	count(broken) > 0
	v := {
		"code": "breaks_whole_node",
		"msg": sprintf("a %d-GPU job takes GPUs from wholly free node(s) %s while whole free nodes are scarce", [input.job.gpus, concat(", ", sort(broken))]),
	}
}
