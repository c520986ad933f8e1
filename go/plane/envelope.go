package plane

// The request envelope, the message a caller sends a worker over NATS: its
// fields, how the caller writes it (encode), how the worker reads it
// (readEnvelope) and what the worker checks before it uses it (check).

import (
	"encoding/json"
	"errors"
	"net"
	"strconv"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
)

// Limits on a request's size.
const (
	// MaxRequestBytes is the largest request (the JSON payload of Generate)
	// the plane carries: a caller refuses a larger one before sending it
	// (ErrTooLarge), a worker refuses an envelope announcing one before it
	// allocates anything for it. One value for every process, so that
	// neither side has a limit the other does not know: 256 MiB, 8 times the
	// frontend's largest body that fits it (a byte of a prompt is at most one
	// token, a token id at most 7 bytes of JSON with its comma), and 36
	// million token ids.
	MaxRequestBytes = 256 << 20
	// InlineRequestBytes is the largest request sent inside its envelope,
	// through NATS. A larger one crosses the network once, from the caller
	// to the worker, which fetches it over TCP (transport.FetchRequest):
	// NATS limits a message to its server's max_payload (1 MB by default),
	// and carries it up to three times on a cluster (docs/scale.md).
	InlineRequestBytes = 64 << 10
)

// envelope is the request message sent over NATS.
type envelope struct {
	ID string `json:"id"` // the correlation id (the caller's context id)
	// Key identifies the logical request internally (see NewKey).
	Key     string          `json:"key"`
	Addr    string          `json:"addr"`
	Token   string          `json:"token"`
	State   ctxtree.State   `json:"state,omitempty"`
	Request json.RawMessage `json:"request"`
	// Metadata is the request's metadata (a JSON object, see WithMetadata).
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// TimeoutUs is the time left until the request's deadline when it was
	// sent, in microseconds (nil: no deadline): never a wall-clock instant,
	// so the worker's own timer needs no clock in common with the caller's.
	TimeoutUs *int64 `json:"timeout_us,omitempty"`
	// RequestBytes, for a request too large for the envelope (see
	// InlineRequestBytes), is its size: the worker fetches it from the
	// caller (transport.FetchRequest), and Request is absent.
	RequestBytes int `json:"request_bytes,omitempty"`
	// Aborts is the subject on which the worker confirms the abort of this
	// request: the caller's own (AbortSubjectOf). Empty, from a caller of
	// an earlier version: AbortedSubject, shared by every caller.
	Aborts string `json:"aborts,omitempty"`
	// Trace is the attempt's trace context (go/tracing), absent while the
	// caller does not trace.
	Trace *tracing.Remote `json:"trace,omitempty"`
}

// encode is json.Marshal of env without its cost for a large request: the
// request and metadata, already checked JSON (Generate, WithMetadata), are
// copied as they are instead of scanned and compacted again. Every request
// pays it, once per attempt.
func (env *envelope) encode() []byte {
	b := make([]byte, 0, len(env.Request)+len(env.Metadata)+len(env.ID)+len(env.Addr)+128)
	b = append(b, `{"id":`...)
	b = append(b, mustJSON(env.ID)...) // the id may hold any printable UTF-8
	b = append(b, `,"key":`...)
	b = append(b, mustJSON(env.Key)...)
	b = append(b, `,"addr":`...)
	b = append(b, mustJSON(env.Addr)...)
	b = append(b, `,"token":`...)
	b = append(b, mustJSON(env.Token)...)
	if env.State != 0 {
		b = append(b, `,"state":`...)
		b = strconv.AppendUint(b, uint64(env.State), 10)
	}
	if env.RequestBytes > 0 {
		b = append(b, `,"request_bytes":`...)
		b = strconv.AppendInt(b, int64(env.RequestBytes), 10)
	} else {
		b = append(b, `,"request":`...)
		b = append(b, env.Request...)
	}
	if len(env.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		b = append(b, env.Metadata...)
	}
	if env.TimeoutUs != nil {
		b = append(b, `,"timeout_us":`...)
		b = strconv.AppendInt(b, *env.TimeoutUs, 10)
	}
	if env.Aborts != "" {
		b = append(b, `,"aborts":`...)
		b = append(b, mustJSON(env.Aborts)...)
	}
	if env.Trace != nil {
		b = append(b, `,"trace":`...)
		b = append(b, mustJSON(env.Trace)...)
	}
	return append(b, '}')
}

// check rejects an envelope that no plane of ours would have sent: a
// stranger on the bus can reach a worker's subject, so everything the
// worker uses is checked before it allocates anything for the request.
func (env *envelope) check() error {
	if ValidateID(env.ID) != nil || !ValidKey(env.Key) || !ValidKey(env.Token) {
		return errMalformedEnvelope
	}
	if host, port, err := net.SplitHostPort(env.Addr); err != nil || host == "" || port == "" {
		return errMalformedEnvelope
	}
	// readEnvelope checked the whole message, so a request that is there is
	// JSON. It is there, or its size is (the worker fetches it), not both.
	if env.State > ctxtree.Killed || (len(env.Request) == 0) == (env.RequestBytes == 0) || env.RequestBytes < 0 {
		return errMalformedEnvelope
	}
	if env.RequestBytes > MaxRequestBytes {
		return errRequestTooLarge // checked before anything is allocated for it
	}
	if len(env.Metadata) > 0 && checkMetadata(env.Metadata) != nil {
		return errMalformedEnvelope
	}
	if env.TimeoutUs != nil {
		if _, err := ctxtree.TimeoutMicros(*env.TimeoutUs); err != nil {
			return errMalformedEnvelope
		}
	}
	if env.Aborts != "" && !validAbortSubject(env.Aborts) {
		return errMalformedEnvelope
	}
	if env.Trace != nil && !env.Trace.Valid() {
		env.Trace = nil // an oversized trace context is ignored, as W3C says, not refused
	}
	return nil
}

var (
	errMalformedEnvelope = errors.New("malformed request envelope")
	errRequestTooLarge   = errors.New("request too large")
)

// readEnvelope is json.Unmarshal into an envelope in one pass over the
// request instead of two (Unmarshal checks the whole message, then decodes
// it, which for a 10 kB prompt is most of a worker's cost per request): the
// message is checked with json.Valid, then its top-level members are found
// by a scan that relies on that check (jsonscan.Object), and only the short
// fields are decoded. It is stricter than Unmarshal: a member whose name
// matches a field's only up to case, is escaped, or names a field twice, is
// refused, so whatever it accepts Unmarshal reads the same way
// (FuzzReadEnvelope).
func readEnvelope(data []byte) (envelope, error) {
	var env envelope
	if !json.Valid(data) {
		return env, errMalformedEnvelope
	}
	members, ok := jsonscan.Object(data)
	if !ok {
		return env, errMalformedEnvelope
	}
	var seen jsonscan.Seen
	for {
		m, ok := members.Next()
		if !ok {
			return env, nil
		}
		if m.Escaped {
			return env, errMalformedEnvelope // an escape could spell a field's name
		}
		match, f := envelopeFields.Match(m.Name, &seen)
		switch match {
		case jsonscan.Other:
			continue // not a field: Unmarshal ignores it too
		case jsonscan.Duplicate, jsonscan.Folded:
			return env, errMalformedEnvelope
		}
		var err error
		switch f {
		case 0:
			err = json.Unmarshal(m.Value, &env.ID)
		case 1:
			err = json.Unmarshal(m.Value, &env.Key)
		case 2:
			err = json.Unmarshal(m.Value, &env.Addr)
		case 3:
			err = json.Unmarshal(m.Value, &env.Token)
		case 4:
			err = json.Unmarshal(m.Value, &env.State)
		case 5:
			env.Request = m.Value
		case 6:
			env.Metadata = m.Value
		case 7:
			err = json.Unmarshal(m.Value, &env.TimeoutUs)
		case 8:
			err = json.Unmarshal(m.Value, &env.RequestBytes)
		case 9:
			err = json.Unmarshal(m.Value, &env.Aborts)
		case 10:
			err = json.Unmarshal(m.Value, &env.Trace) // its content is checked by check, and by W3C's rules
		}
		if err != nil {
			return env, errMalformedEnvelope
		}
	}
}

// envelopeFields are the JSON names of envelope's fields, in the order
// readEnvelope's switch knows them.
var envelopeFields = jsonscan.NewKeys("id", "key", "addr", "token", "state", "request", "metadata", "timeout_us", "request_bytes", "aborts", "trace")
