// Package events is toposched's event catalogue: one Go type per event, the
// subjects they travel on, and the CloudEvents 1.0 envelope (binary mode over
// NATS headers) that wraps every message.
//
// The JSON Schemas in the schemas package are the contract for non-Go users;
// a test proves every type here matches its schema. A Go launcher imports
// this package (and events/bus) to publish jobs and read decisions.
//
// Subjects are "<prefix>.<domain>.<event>", the prefix "toposched" by
// default. Node-scoped events add the node name as a last token (escaped
// with NodeToken), so that a stream can keep the newest report per node
// and a node's agent may publish its own alone; the events users and
// agents send about jobs may travel under a tenant's or a node's scope
// (scope.go), which NATS permissions check.
package events
