package toposched.nodes.tenant_isolation_test

import data.toposched.nodes.tenant_isolation

test_same_tenant_allowed if {
	denied := tenant_isolation.deny with input as {"job": {"tenant": "a"}, "node": {"name": "n1", "labels": {"tenant": "a"}}}
	count(denied) == 0
}

test_other_tenant_denied if {
	denied := tenant_isolation.deny with input as {"job": {"tenant": "b"}, "node": {"name": "n1", "labels": {"tenant": "a"}}}
	some v in denied
	v.code == "tenant_mismatch"
}

test_no_tenant_on_reserved_node_denied if {
	denied := tenant_isolation.deny with input as {"job": {"tenant": ""}, "node": {"name": "n1", "labels": {"tenant": "a"}}}
	count(denied) == 1
}

test_unlabelled_node_shared if {
	denied := tenant_isolation.deny with input as {"job": {"tenant": "b"}, "node": {"name": "n1", "labels": {}}}
	count(denied) == 0
}
