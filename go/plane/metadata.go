package plane

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// MaxMetadataBytes bounds a request's metadata (its JSON encoding): it
// travels in the request envelope on every hop, so it is for small
// per-request facts (tenant, region, trace ids), not payloads.
const MaxMetadataBytes = 16 << 10

// ErrBadMetadata: request metadata that is not a JSON object, or is larger
// than MaxMetadataBytes.
var ErrBadMetadata = errors.New("request metadata must be a JSON object")

// GenerateOption adjusts one request sent by Client.Generate.
type GenerateOption func(*generateOptions)

type generateOptions struct {
	metadata    json.RawMessage
	reservation *Reservation // the first attempt's place (WithReservation); nil: routed as usual
	attempt     int          // the attempt's number (migrate.go), for its span
}

// WithMetadata attaches metadata (a JSON object, at most MaxMetadataBytes)
// to the request. It reaches the handler's side as Request.Metadata, on
// every attempt of a migrating request. Empty means none.
func WithMetadata(meta []byte) GenerateOption {
	return func(o *generateOptions) { o.metadata = meta }
}

func applyGenerateOptions(opts []GenerateOption) (generateOptions, error) {
	var o generateOptions
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if len(o.metadata) == 0 {
		o.metadata = nil
		return o, nil
	}
	if err := checkMetadata(o.metadata); err != nil {
		return o, err
	}
	// The caller may reuse its buffer: keep our own copy.
	o.metadata = append(json.RawMessage(nil), o.metadata...)
	return o, nil
}

// checkMetadata is the one rule for metadata, applied by the caller before
// sending and by the worker on receipt.
func checkMetadata(meta []byte) error {
	if len(meta) > MaxMetadataBytes {
		return fmt.Errorf("%w of at most %d bytes, got %d", ErrBadMetadata, MaxMetadataBytes, len(meta))
	}
	if !jsonscan.HasAt(meta, jsonscan.SkipSpace(meta, 0), "{") || !json.Valid(meta) {
		return ErrBadMetadata
	}
	return nil
}
