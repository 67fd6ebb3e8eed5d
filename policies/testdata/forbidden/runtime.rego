package toposched.nodes.env

deny contains v if {
	rt := opa.runtime()
	v := {"code": "x", "msg": sprintf("%v", [rt.env])}
}
