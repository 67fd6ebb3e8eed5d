# A policy whose evaluation fails: a node with no GPUs divides by zero.
package toposched.placement.divide

ratio := input.placement.nodes[0].gpus / input.placement.nodes[0].gpus_total

deny contains v if {
	ratio > 2
	v := {"code": "x", "msg": "never"}
}
