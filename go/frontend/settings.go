package frontend

// A frontend's settings as a host hands them over: one typed value
// (Settings; dc_frontend_start takes it as JSON), whose settings a user
// gives as text are parsed here only, each by its one parser, against the
// one statement of its range. The library reads no environment variable
// for them: the host resolves its own interface (the command: a flag, else
// its variable, else nothing, python/dynamo_ctx/cli/frontend.py) and says
// where each text came from, which a refusal names.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// Settings is a frontend's configuration as one value: what a host hands
// over (DecodeSettings reads it from JSON, the members named by the tags)
// and Start makes the Options of. A setting left out (nil) is its default.
type Settings struct {
	// Addr is the listen address ("127.0.0.1:8000"; "": a free port on
	// every address, as net.Listen takes it).
	Addr string `json:"addr"`
	// Namespace of the workers' endpoints ("": "dynamo").
	Namespace string `json:"namespace,omitempty"`
	// MigrationLimit overrides the limit the workers declare (nil or below
	// 0: as they declare; Options.MigrationLimit).
	MigrationLimit *int `json:"migration_limit,omitempty"`
	// MaxBodyBytes gives Options.MaxBodyBytes: a number of bytes, 1 or more.
	MaxBodyBytes *Given `json:"max_body_bytes,omitempty"`
	// MaxIdleConnections gives Options.MaxIdleConnections: a number of
	// connections, 1 or more.
	MaxIdleConnections *Given `json:"max_idle_connections,omitempty"`
	// RequestTimeout gives Options.RequestTimeout: seconds, as the
	// x-request-timeout header gives them (ParseTimeout).
	RequestTimeout *Given `json:"request_timeout,omitempty"`
	// MaxQueuedRequests gives Options.MaxQueuedRequests: a number of
	// requests from 0 (no queue) to MaxQueuedLimit.
	MaxQueuedRequests *Given `json:"max_queued_requests,omitempty"`
	// AdaptiveProcs gives Options.AdaptiveProcs (nil: false).
	AdaptiveProcs *bool `json:"adaptive_procs,omitempty"`
}

// Given is a setting as a user gave it: its text, parsed here, and where it
// came from (Source: a flag, "--max-body-bytes", or an environment
// variable, "DYNAMO_CTX_MAX_BODY_BYTES"), which a refusal names. Without a
// source a refusal names the setting's member of Settings.
type Given struct {
	Text   string `json:"text"`
	Source string `json:"source,omitempty"`
}

// SettingError is a setting whose value the frontend refuses. Its message
// names the setting as its source spells it, with the value: `--flag
// "value": why` for a flag (a Name that starts with "-"), else
// `NAME="value": why`.
type SettingError struct {
	Name, Value string
	Err         error // why
}

func (e *SettingError) Error() string {
	if strings.HasPrefix(e.Name, "-") {
		return fmt.Sprintf("%s %q: %v", e.Name, e.Value, e.Err)
	}
	return fmt.Sprintf("%s=%q: %v", e.Name, e.Value, e.Err)
}

func (e *SettingError) Unwrap() error { return e.Err }

// ErrBadSettings is a settings value that is not one: not JSON, not an
// object, a member that is not a setting (or names one only up to case, or
// twice), or a member of the wrong type.
var ErrBadSettings = errors.New("settings are not a JSON object of the frontend's settings")

// textSettings are the settings given as text, in the order they are
// checked: each one's member name, where Settings holds it, and its parser
// into the option it gives.
var textSettings = []struct {
	name  string
	given func(s *Settings) *Given
	set   func(o *Options, text string) error
}{
	{"max_body_bytes", func(s *Settings) *Given { return s.MaxBodyBytes }, func(o *Options, v string) (err error) {
		o.MaxBodyBytes, err = parsePositive(v, "bytes")
		return err
	}},
	{"max_idle_connections", func(s *Settings) *Given { return s.MaxIdleConnections }, func(o *Options, v string) error {
		n, err := parsePositive(v, "connections")
		o.MaxIdleConnections = int(n)
		return err
	}},
	{"request_timeout", func(s *Settings) *Given { return s.RequestTimeout }, func(o *Options, v string) (err error) {
		o.RequestTimeout, err = ParseTimeout(v)
		return err
	}},
	{"max_queued_requests", func(s *Settings) *Given { return s.MaxQueuedRequests }, func(o *Options, v string) (err error) {
		o.MaxQueuedRequests, err = parseMaxQueued(v)
		return err
	}},
}

// settingsKeys are the member names of Settings and Given, matched exactly.
var settingsKeys = jsonscan.NewKeys("addr", "namespace", "migration_limit", "max_body_bytes", "max_idle_connections",
	"request_timeout", "max_queued_requests", "adaptive_procs", "text", "source")

// DecodeSettings reads Settings from JSON. Members are matched exactly: one
// that is not a setting, names one only up to case, or names one twice, is
// refused (ErrBadSettings), so a misspelt setting is never taken for its
// default.
func DecodeSettings(data []byte) (Settings, error) {
	var s Settings
	if !json.Valid(data) {
		return s, ErrBadSettings
	}
	if p, found := settingsKeys.Check(data); found {
		return s, fmt.Errorf("%w: the member %q", ErrBadSettings, p.Name)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Settings{}, fmt.Errorf("%w: %v", ErrBadSettings, err)
	}
	return s, nil
}

// Options are the options s gives, the rest zero (their defaults), or the
// first setting refused, a *SettingError.
func (s Settings) Options() (Options, error) {
	o := Options{Addr: s.Addr, Namespace: s.Namespace, MigrationLimit: -1}
	if s.MigrationLimit != nil {
		o.MigrationLimit = *s.MigrationLimit
	}
	o.AdaptiveProcs = s.AdaptiveProcs != nil && *s.AdaptiveProcs
	for _, t := range textSettings {
		g := t.given(&s)
		if g == nil {
			continue
		}
		if err := t.set(&o, g.Text); err != nil {
			name := g.Source
			if name == "" {
				name = t.name
			}
			return Options{}, &SettingError{Name: name, Value: g.Text, Err: err}
		}
	}
	return o, nil
}

// Check returns what Start would refuse of s before it starts anything (a
// *SettingError), or nil: a host checks its settings with it before it
// connects, so a bad value is reported before anything else can fail.
func (s Settings) Check() error {
	_, err := s.Options()
	return err
}

// Start starts a frontend on rt as s says (New with s's Options).
func Start(ctx context.Context, rt *plane.Runtime, s Settings) (*Frontend, error) {
	o, err := s.Options()
	if err != nil {
		return nil, err
	}
	return New(ctx, rt, o)
}

// parsePositive reads a whole number of units, 1 or more.
func parsePositive(v, units string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("want a positive number of %s", units)
	}
	return n, nil
}

// parseMaxQueued reads a queue bound as Settings.MaxQueuedRequests spells
// it (a number of requests, 0 for none) as Options.MaxQueuedRequests takes
// it (-1 for none).
func parseMaxQueued(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 || checkMaxQueued(n) != nil {
		return 0, fmt.Errorf("want a number of requests from 0 (no queue) to %d", MaxQueuedLimit)
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}

// MaxQueuedLimit bounds the queue bound: a waiting request costs a
// goroutine and its body, so a million is already more than a process
// should hold.
const MaxQueuedLimit = 1 << 20

// checkMaxQueued checks a queue bound against MaxQueuedLimit: the one
// statement of its range, for the text (parseMaxQueued) and for
// Options.MaxQueuedRequests (defaults).
func checkMaxQueued(n int) error {
	if n > MaxQueuedLimit {
		return fmt.Errorf("MaxQueuedRequests %d: at most %d", n, MaxQueuedLimit)
	}
	return nil
}
