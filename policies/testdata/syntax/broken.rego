package toposched.nodes.broken

deny contains v if {
	v := {"code": "x", "msg": "unterminated"
}
