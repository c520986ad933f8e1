package frontend

// Outcomes: every worker request the frontend sends (each choice of an HTTP
// request, counted in dynamo_ctx_frontend_requests_total) ends in exactly
// one outcome, counted in dynamo_ctx_frontend_outcomes_total{model,outcome}:
//
//   - completed: the worker finished it (its final marker), or a stop
//     string ended it;
//   - deadline: its deadline passed (deadline.go);
//   - failed: the worker's handler raised, or its stream broke and was not
//     (or no longer) migrated;
//   - stopped: the worker's handler stopped it on purpose;
//   - rejected: no worker received it (no responders, or every worker
//     busy and the queue full);
//   - cancelled: killed before it finished: the client went away, another
//     choice of the request failed, or a drain ended it.

import (
	"errors"
	"io"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

// The outcomes, in the order the metrics list them.
var outcomes = []string{"completed", "stopped", "cancelled", "deadline", "failed", "rejected"}

// outcome is the choice's one outcome, once serve is done with it.
func (c *choice) outcome() string {
	switch {
	case c.refused != "":
		return c.refused // readmitted, it got no place (resend.go)
	case c.complete.Load() || c.stream().Completed():
		return "completed"
	case byDeadline(c):
		return "deadline"
	case c.endErr != nil && !errors.Is(c.endErr, io.EOF):
		switch {
		case errors.Is(c.endErr, plane.ErrNoResponders): // ErrBusy too
			return "rejected"
		case errors.Is(c.endErr, transport.ErrStoppedByHandler):
			return "stopped"
		}
		return "failed"
	}
	return "cancelled"
}
