// Package bus carries toposched's events over NATS JetStream and runs every
// service's handlers through one Watermill router with one middleware stack.
//
// The choice of transport lives here and nowhere else. Watermill provides the
// router, the handler contract and the middleware (recoverer, retry, poison
// queue); the Publisher and Subscriber under it are a small adapter on
// nats.go's jetstream package rather than watermill-nats/v2: that package sits
// on the legacy JetStreamContext with push consumers and measured 3-10x
// slower here, cannot name streams apart from subjects, and hides the NATS
// headers we need for the CloudEvents envelope and Nats-Msg-Id.
//
// Delivery is at least once. A handler's outputs are published (and their
// PubAcks awaited) before its input is acked; outputs carry ids derived from
// the input's id, so a redelivered input republishes the same ids and
// JetStream drops the copies. Durable pull consumers shared by every replica
// of a service are the queue groups: each message goes to one replica.
package bus
