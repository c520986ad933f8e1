package plane

import (
	"bytes"
	"encoding/json"
	"errors"
)

var errMalformedEnvelope = errors.New("malformed request envelope")

// readEnvelope is json.Unmarshal into an envelope in one pass over the
// request instead of two (Unmarshal checks the whole message, then decodes
// it, which for a 10 kB prompt is most of a worker's cost per request): the
// message is checked with json.Valid, then its top-level members are found
// by a scan that relies on that check, and only the short fields are
// decoded. It is stricter than Unmarshal: a member whose name matches a
// field's only up to case, or names a field twice, is refused, so whatever
// it accepts Unmarshal reads the same way (FuzzReadEnvelope).
func readEnvelope(data []byte) (envelope, error) {
	var env envelope
	if !json.Valid(data) {
		return env, errMalformedEnvelope
	}
	i := skipSpace(data, 0)
	if data[i] != '{' {
		return env, errMalformedEnvelope
	}
	var seen [len(envelopeFields)]bool
	i = skipSpace(data, i+1)
	for data[i] != '}' {
		end := skipValue(data, i) // the member's name: a string
		name := data[i+1 : end-1]
		i = skipSpace(data, skipSpace(data, end)+1) // past ':'
		end = skipValue(data, i)
		value := data[i:end]
		i = skipSpace(data, end)
		if data[i] == ',' {
			i = skipSpace(data, i+1)
		}
		if bytes.IndexByte(name, '\\') >= 0 {
			return env, errMalformedEnvelope // an escape could spell a field's name
		}
		f := -1
		for k, field := range envelopeFields {
			if bytes.EqualFold(name, []byte(field)) {
				f = k
				break
			}
		}
		if f < 0 {
			continue // not a field: Unmarshal ignores it too
		}
		if seen[f] || string(name) != envelopeFields[f] {
			return env, errMalformedEnvelope
		}
		seen[f] = true
		var err error
		switch f {
		case 0:
			err = json.Unmarshal(value, &env.ID)
		case 1:
			err = json.Unmarshal(value, &env.Key)
		case 2:
			err = json.Unmarshal(value, &env.Addr)
		case 3:
			err = json.Unmarshal(value, &env.Token)
		case 4:
			err = json.Unmarshal(value, &env.State)
		case 5:
			env.Request = value
		case 6:
			env.Metadata = value
		case 7:
			err = json.Unmarshal(value, &env.TimeoutUs)
		}
		if err != nil {
			return env, errMalformedEnvelope
		}
	}
	return env, nil
}

// envelopeFields are the JSON names of envelope's fields, in the order
// readEnvelope's switch knows them.
var envelopeFields = [...]string{"id", "key", "addr", "token", "state", "request", "metadata", "timeout_us"}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value that starts at b[i], b being
// valid JSON (json.Valid).
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		for i++; ; i++ {
			switch b[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = skipValue(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	default: // a number, true, false or null
		for ; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return i
			}
		}
		return i
	}
}
