package toposched.nodes.always_test

import data.toposched.nodes.always

test_passes if {
	count(always.deny) == 1 with input as {"node": {"name": "n1"}}
}

test_fails if {
	count(always.deny) == 0 with input as {"node": {"name": "n1"}}
}
