package toposched.nodes.always

deny contains v if {
	input.node.name == "n1"
	v := {"code": "always", "msg": "n1 is always denied"}
}
