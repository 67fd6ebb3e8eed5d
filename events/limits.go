package events

// MaxMessageBytes is the most one message may hold, body and headers: the
// max_payload of the NATS servers toposched runs on (deploy/nats, the
// chart, the embedded server) and the max_msg_size of its streams. NATS
// refuses a bigger message, and asking again never helps; a service that
// builds an event bigger than its cause (analysis, whose jobs.analyzed
// lists every rank of every group) bounds what it builds by it.
const MaxMessageBytes = 8 << 20

// MaxDepth is the most arrays and objects one event may nest: none nests
// more than six, and a body that nests deeper is refused before anything
// builds a document of it (schemas.MaxDepth is the same bound).
const MaxDepth = 64

// maxDocumentValues bounds the values of a body that DecodeJSON reads
// into a document of its own, to take 8.0 where an integer is wanted and
// to name every field at fault: such a document costs some 250 to 600
// bytes a value (an args of 400,000 numbers took 238 MB and 0.4 s), and a
// message under MaxMessageBytes can hold four million. A larger body is
// read by decodeLarge, which costs a copy of it.
const maxDocumentValues = 1 << 14

// shape counts the values of a JSON body (every string, number, true,
// false, null, array and object, property names included) and how deep
// its arrays and objects nest, in one pass that allocates nothing. It
// stops counting past limit values, and does not check the grammar: it
// bounds what reading the body will cost, the reader says whether it is
// JSON.
func shape(body []byte, limit int) (values, depth int) {
	nesting := 0
	for i := 0; i < len(body) && values <= limit; i++ {
		switch c := body[i]; c {
		case '"':
			values++
			for i++; i < len(body) && body[i] != '"'; i++ {
				if body[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			values++
			if nesting++; nesting > depth {
				depth = nesting
			}
		case ']', '}':
			nesting--
		case 't', 'f', 'n', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			values++
			for i+1 < len(body) && isLiteralByte(body[i+1]) {
				i++
			}
		}
	}
	return values, depth
}

// isLiteralByte reports whether c may continue a number or a literal.
func isLiteralByte(c byte) bool {
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '+' || c == '-' || c == 'E'
}

// Headers of a dead letter whose body was too large to copy beside its
// headers: it keeps the body's first bytes, and these say what the body
// was. (HeaderError says why it was refused.)
const (
	// HeaderDeadSize is the size of the body in bytes.
	HeaderDeadSize = "toposched-dead-size"
	// HeaderDeadSHA256 is the body's SHA-256, lower-case hex.
	HeaderDeadSHA256 = "toposched-dead-sha256"
)
