package discovery

// Endpoint paths and the NATS subjects made of them.

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// Subject layout. Announcements and queries use separate prefixes so that a
// watcher's announcement subscription never receives queries.
const (
	announcePrefix = "dc.inst."
	queryPrefix    = "dc.query."
	requestPrefix  = "dc.req."
)

// ErrBadPath is matched (errors.Is) by the errors of ValidatePath and
// ValidateName.
var ErrBadPath = errors.New("invalid endpoint path")

// ValidatePath checks an endpoint path "namespace.component.endpoint": three
// parts, each valid by ValidateName. This is the one rule for endpoint paths:
// plane, the C ABI (dc_endpoint_path_check) and the Python API use it.
func ValidatePath(path string) error {
	parts := strings.Split(path, ".")
	if len(parts) != 3 {
		return fmt.Errorf("%w: %q must be namespace.component.endpoint", ErrBadPath, path)
	}
	for _, p := range parts {
		if ValidateName(p) != nil {
			return fmt.Errorf("%w: %q: each part must be non-empty without '*', '>', whitespace or control characters", ErrBadPath, path)
		}
	}
	return nil
}

// ValidateName checks one part of an endpoint path (a namespace, component
// or endpoint name): non-empty, without '.', '*', '>' (NATS subject syntax),
// whitespace or control characters.
func ValidateName(name string) error {
	if name == "" || strings.ContainsFunc(name, func(r rune) bool {
		return r == '.' || r == '*' || r == '>' || unicode.IsSpace(r) || unicode.IsControl(r)
	}) {
		return fmt.Errorf("%w: name %q must be non-empty without '.', '*', '>', whitespace or control characters", ErrBadPath, name)
	}
	return nil
}

// RequestSubject is the subject on which instance id of the endpoint at path
// receives requests: "dc.req.<namespace>.<component>.<endpoint>.<hex id>".
// path must be valid (see ValidatePath). A request to it when the instance
// is gone fails at once with nats.ErrNoResponders (see the package
// documentation).
func RequestSubject(path string, instanceID uint64) string {
	return fmt.Sprintf("%s%s.%x", requestPrefix, path, instanceID)
}

func announceSubject(path string) string { return announcePrefix + path }
func querySubject(path string) string    { return queryPrefix + path }
