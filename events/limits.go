package events

// MaxMessageBytes is the most one message may hold, body and headers: the
// max_payload of the NATS servers toposched runs on (deploy/nats, the
// chart, the embedded server) and the max_msg_size of its streams. NATS
// refuses a bigger message, and asking again never helps; a service that
// builds an event bigger than its cause (analysis, whose jobs.analyzed
// lists every rank of every group) bounds what it builds by it.
const MaxMessageBytes = 8 << 20
