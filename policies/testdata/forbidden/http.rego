package toposched.placement.phone_home

deny contains v if {
	resp := http.send({"method": "GET", "url": "http://example.com"})
	v := {"code": "x", "msg": resp.body}
}
