# Maximum leaf span by job size.
#
# A job may span at most as many leaf switches as its size tier allows:
# up to 8 GPUs one leaf, up to 64 two, up to 512 eight, larger jobs any
# number. The tiers can be replaced with data.toposched.config.leaf_span.limits,
# a list of {"max_gpus": N, "max_leaves": M}.
package toposched.placement.leaf_span

default limits := [
	{"max_gpus": 8, "max_leaves": 1},
	{"max_gpus": 64, "max_leaves": 2},
	{"max_gpus": 512, "max_leaves": 8},
]

limits := data.toposched.config.leaf_span.limits

# max_leaves is the limit of the smallest tier that holds the job; undefined
# (no limit) when no tier does.
max_leaves := min(allowed) if {
	allowed := [t.max_leaves | some t in limits; input.job.gpus <= t.max_gpus]
	count(allowed) > 0
}

deny contains v if {
	count(input.placement.leaves) > max_leaves
	v := {
		"code": "leaf_span",
		"msg": sprintf("a %d-GPU job may span %d leaf switches, the candidate spans %d", [input.job.gpus, max_leaves, count(input.placement.leaves)]),
	}
}
