package plane

import (
	"encoding/json"
	"errors"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

var errMalformedEnvelope = errors.New("malformed request envelope")

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
		}
		if err != nil {
			return env, errMalformedEnvelope
		}
	}
}

// envelopeFields are the JSON names of envelope's fields, in the order
// readEnvelope's switch knows them.
var envelopeFields = jsonscan.NewKeys("id", "key", "addr", "token", "state", "request", "metadata", "timeout_us")
