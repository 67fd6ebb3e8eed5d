package toposched.nodes.divide

deny contains v if {
	input.node.gpus.free / input.node.gpus.total > 2
	v := {"code": "x", "msg": "never"}
}
