package frontend

// Deadlines: a client says how long it will wait with the x-request-timeout
// header (seconds, a decimal number), the frontend has a default
// (Options.RequestTimeout, --request-timeout); the smaller wins. Every
// worker request of the HTTP request gets that deadline, which travels to
// every hop as time left (go/plane). When it passes before the response
// started: 504, code deadline_exceeded; after (a stream): a final SSE error
// event with that code, then the end of the stream.

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
)

// RequestTimeoutHeader is the header in which a client gives its request's
// timeout, in seconds.
const RequestTimeoutHeader = "x-request-timeout"

// errDeadline ends a response whose deadline passed.
var errDeadline = errors.New("the request's deadline passed (" + RequestTimeoutHeader + " or the frontend's --request-timeout)")

// ParseTimeout reads a timeout in seconds (a decimal number, in
// ctxtree's range: ctxtree.Timeout): the header's and
// Settings.RequestTimeout's one parser.
func ParseTimeout(s string) (time.Duration, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number of seconds", s)
	}
	return ctxtree.Timeout(v)
}

// requestDeadline is the deadline of a request that arrived at start: the
// earlier of its header's and the frontend's default; zero for none.
func (f *Frontend) requestDeadline(r *http.Request, start time.Time) (time.Time, error) {
	timeout := f.opts.RequestTimeout
	if v := r.Header.Get(RequestTimeoutHeader); v != "" {
		d, err := ParseTimeout(v)
		if err != nil {
			return time.Time{}, fmt.Errorf("the %s header: %w", RequestTimeoutHeader, err)
		}
		if timeout <= 0 || d < timeout {
			timeout = d
		}
	}
	if timeout <= 0 {
		return time.Time{}, nil
	}
	return start.Add(timeout), nil
}

// deadlineExceeded answers a request whose deadline passed before its
// response started.
func deadlineExceeded(w http.ResponseWriter) {
	writeError(w, http.StatusGatewayTimeout, errDeadline.Error(), "timeout_error", "", "deadline_exceeded")
}

// byDeadline reports whether a choice's worker request ended because its
// deadline passed: by the timer of its context, of its attempt's (a child,
// whose timer may fire first), or a worker's.
func byDeadline(c *choice) bool {
	for _, ctx := range []*ctxtree.Context{c.reqCtx, c.stream().Context()} {
		if ctx.Reason() == ctxtree.ReasonDeadline || ctx.Cause() == ctxtree.ReasonDeadline {
			return true
		}
	}
	left, ok := c.reqCtx.Remaining()
	return ok && left <= 0
}
