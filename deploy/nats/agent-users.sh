#!/bin/sh
# Prints one NATS user entry per GPU node for deploy/nats/auth.conf: the
# node's agent may publish its own topology and health and nothing else.
# Usage: agent-users.sh NODE... (names as the agent reports them, --node).
set -eu
[ $# -gt 0 ] || { echo "usage: $0 NODE..." >&2; exit 2; }
for node in "$@"; do
  # A node name's dots are escaped in subjects (events.NodeToken).
  tok=$(printf '%s' "$node" | sed -e 's/%/%25/g' -e 's/\./%2E/g' -e 's/\*/%2A/g' -e 's/>/%3E/g' -e 's/ /%20/g')
  printf '      {user: "agent-%s", password: $TOPOSCHED_AGENT_PASSWORD, permissions: {publish: ["toposched.topology.node.%s", "toposched.topology.health.%s"], subscribe: "_INBOX.>"}}\n' "$node" "$tok" "$tok"
done
