package toposched.nodes.lookup

deny contains v if {
	addrs := net.lookup_ip_addr(input.node.name)
	v := {"code": "x", "msg": sprintf("%v", [addrs])}
}
