// Package authcallout gives each node's agent in a Kubernetes cluster its
// own NATS identity without a seed per node: the agent signs in with a
// projected ServiceAccount token of its pod, and a NATS auth callout
// responder (run by toposched kube) checks the token with the API server's
// TokenReview and answers with a user JWT allowed exactly the agent-<node>
// role of the node the pod is bound to.
//
// The NATS servers send every sign-in of a user they do not know (and of a
// known user not listed as an auth user) to $SYS.REQ.USER.AUTH in the
// callout account (toposched roles conf --auth-callout-issuer writes that
// configuration). The responder accepts a token only if the API server
// authenticates it for the audience, it is the agents' ServiceAccount's,
// it is bound to a pod (the token names the pod and its node,
// authentication.kubernetes.io/node-name: Kubernetes 1.32 or later) that
// exists with that UID, runs as that ServiceAccount and is bound to that
// node. The user JWT it signs with the issuer's account key expires with
// the token, or sooner; the server then closes the connection and the
// agent signs in again with the token the kubelet has refreshed meanwhile.
//
// A pod on node B cannot get node A's identity: its token names node B,
// and only the kubelet of node A can have a token issued for a pod bound
// to node A (the NodeRestriction admission). Who may create pods as the
// agents' ServiceAccount, or tokens for it, may act as any node's agent:
// the agents' namespace is the trust boundary (deploy/README.md).
package authcallout
