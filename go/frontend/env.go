package frontend

// The frontend's settings that an environment variable may give, each read
// and parsed here only. The command's flags of the same settings
// (python/dynamo_ctx/cli/frontend.py) hand their text on through these
// variables, unparsed, so a value given either way meets the one parser
// below; an option that New's caller sets is not looked up.

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The environment variables of Options, read by New (with Options.Getenv)
// for the options left zero.
const (
	// EnvMaxBodyBytes gives Options.MaxBodyBytes: a number of bytes, 1 or
	// more.
	EnvMaxBodyBytes = "DYNAMO_CTX_MAX_BODY_BYTES"
	// EnvMaxIdleConnections gives Options.MaxIdleConnections: a number of
	// connections, 1 or more.
	EnvMaxIdleConnections = "DYNAMO_CTX_MAX_IDLE_CONNECTIONS"
	// EnvRequestTimeout gives Options.RequestTimeout: seconds, as the
	// x-request-timeout header gives them (ParseTimeout).
	EnvRequestTimeout = "DYNAMO_CTX_REQUEST_TIMEOUT"
	// EnvMaxQueuedRequests gives Options.MaxQueuedRequests: a number of
	// requests from 0 (no queue) to 1,048,576.
	EnvMaxQueuedRequests = "DYNAMO_CTX_MAX_QUEUED_REQUESTS"
)

// SettingError is an environment variable whose value New refuses. Its
// message begins with the variable's name and its value ("NAME=\"value\": ").
type SettingError struct {
	Name, Value string
	Err         error // why
}

func (e *SettingError) Error() string { return fmt.Sprintf("%s=%q: %v", e.Name, e.Value, e.Err) }

func (e *SettingError) Unwrap() error { return e.Err }

// envSettings are the variables in the order New reads them: for each, the
// option it gives, whether the caller left it zero, and its parser.
var envSettings = []struct {
	name  string
	unset func(o *Options) bool
	set   func(o *Options, v string) error
}{
	{EnvMaxBodyBytes, func(o *Options) bool { return o.MaxBodyBytes <= 0 }, func(o *Options, v string) (err error) {
		o.MaxBodyBytes, err = parsePositive(v, "bytes")
		return err
	}},
	{EnvMaxIdleConnections, func(o *Options) bool { return o.MaxIdleConnections <= 0 }, func(o *Options, v string) error {
		n, err := parsePositive(v, "connections")
		o.MaxIdleConnections = int(n)
		return err
	}},
	{EnvRequestTimeout, func(o *Options) bool { return o.RequestTimeout == 0 }, func(o *Options, v string) (err error) {
		o.RequestTimeout, err = ParseTimeout(v)
		return err
	}},
	{EnvMaxQueuedRequests, func(o *Options) bool { return o.MaxQueuedRequests == 0 }, func(o *Options, v string) (err error) {
		o.MaxQueuedRequests, err = parseMaxQueued(v)
		return err
	}},
}

// CheckSettings parses the frontend's environment variables as New would,
// through getenv (nil: os.Getenv), and returns the first refusal, a
// *SettingError, or nil. A command checks them with it before it connects,
// so a bad value is reported before anything else can fail.
func CheckSettings(getenv func(string) string) error {
	o := Options{Getenv: getenv}
	return o.fromEnv()
}

// fromEnv sets the options left zero from their environment variables, those
// that are set and not empty.
func (o *Options) fromEnv() error {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	for _, s := range envSettings {
		if !s.unset(o) {
			continue
		}
		if v := getenv(s.name); v != "" {
			if err := s.set(o, v); err != nil {
				return &SettingError{Name: s.name, Value: v, Err: err}
			}
		}
	}
	return nil
}

// parsePositive reads a whole number of units, 1 or more.
func parsePositive(v, units string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("want a positive number of %s", units)
	}
	return n, nil
}

// parseMaxQueued reads a queue bound as EnvMaxQueuedRequests spells it (a
// number of requests, 0 for none) as Options.MaxQueuedRequests takes it
// (-1 for none).
func parseMaxQueued(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 || n > maxQueuedLimit {
		return 0, fmt.Errorf("want a number of requests from 0 (no queue) to %d", maxQueuedLimit)
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}

// maxQueuedLimit bounds the queue bound: a waiting request costs a
// goroutine and its body, so a million is already more than a process
// should hold.
const maxQueuedLimit = 1 << 20
