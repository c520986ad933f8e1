package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/tokens"
)

// requestID is the request's correlation id: the first of the id headers
// present (it must pass plane.ValidateID), else a new uuid.
func requestID(r *http.Request) (string, error) {
	for _, h := range []string{"x-request-id", "x-dynamo-request-id"} {
		v := strings.TrimSpace(r.Header.Get(h))
		if v == "" {
			continue // an empty header is no id
		}
		if err := plane.ValidateID(v); err != nil {
			return "", fmt.Errorf("the %s header must be 1 to %d bytes of printable UTF-8", h, plane.MaxIDLen)
		}
		return v, nil
	}
	return ctxtree.NewID(), nil
}

// workerItem is a worker's response item (the token schema: go/tokens).
type workerItem = tokens.Item

// choice is one worker request of an HTTP request (one choice of the
// response) and what it has produced.
type choice struct {
	index  int
	reqCtx *ctxtree.Context
	st     atomic.Pointer[plane.Stream] // its worker request (stream()); replaced by a resend
	// resend sends the worker request again (resend.go); items counts
	// those it produced, resends the times it was sent again.
	resend  func() (*plane.Stream, error)
	items   int
	resends int
	// complete: the worker's stream ended normally, or the frontend ended
	// it at a stop string: a disconnect now cancels nothing.
	complete atomic.Bool
	ended    bool // no more items are read from it
	started  bool // a chunk of it was sent (the first carries the chat role)
	stop     stopper
	endErr   error   // how its stream ended, once it did (io.EOF: cleanly)
	text     decoder // the model's output as text
	tokens   int
	all      strings.Builder // the whole text, for a non-streaming response
	finish   string
}

// take applies an item to the choice; it returns the text to send and
// whether the choice's finish reason is now known.
func (c *choice) take(it workerItem) (string, bool) {
	c.tokens += len(it.TokenIDs)
	text, hit := c.stop.feed(c.text.next(it.TokenIDs))
	if hit {
		c.finish = "stop"
		return text, true
	}
	if it.FinishReason != nil {
		c.finish = *it.FinishReason
		return text + c.stop.flush(), true
	}
	return text, false
}

func (f *Frontend) serve(w http.ResponseWriter, r *http.Request, chat bool) {
	start := time.Now()
	id, err := requestID(r)
	if err != nil {
		badRequest(w, err.Error(), "", "invalid_request_id")
		return
	}
	w.Header().Set("x-request-id", id)
	deadline, err := f.requestDeadline(r, start)
	if err != nil {
		badRequest(w, err.Error(), "", "invalid_request_timeout")
		return
	}
	ctl := http.NewResponseController(w)
	body, err := readBody(w, r, f.opts.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			tooLarge(w, fmt.Sprintf("the request body exceeds %d bytes", mbe.Limit))
			return
		}
		badRequest(w, "could not read the request body", "", "invalid_body")
		return
	}
	// The body is read: the read deadline (there for slow senders) must not
	// cut a long response, nor make the server's background read (which
	// notices a disconnect) fail while the response is streaming.
	_ = ctl.SetReadDeadline(time.Time{})
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, "the request body is not valid JSON: "+err.Error(), "", "invalid_json")
		return
	}
	if re := checkKeys(body); re != nil {
		badRequest(w, re.msg, re.param, re.code)
		return
	}
	body = nil
	if req.Model == "" {
		badRequest(w, "model is required", "model", "missing_model")
		return
	}
	p := &plan{req: &req, chat: chat}
	refuse := func(err error) {
		var re *requestError
		if errors.As(err, &re) {
			badRequest(w, re.msg, re.param, re.code)
			return
		}
		badRequest(w, err.Error(), "", "invalid_request")
	}
	if err := p.check(); err != nil {
		refuse(err)
		return
	}
	if !f.hasModel(req.Model) {
		modelNotFound(w, req.Model)
		return
	}
	client, err := f.modelClient(req.Model)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error(), "service_unavailable", "", "service_unavailable")
		return
	}
	if len(client.Instances()) == 0 {
		modelNotFound(w, req.Model)
		return
	}
	// The model's language: its own tokenizer and chat template, or the
	// stand-in. Prompt sizes are checked before a text is expanded into
	// token ids, and prompt tokens + max_tokens must fit the model's
	// context length.
	tx, err := f.textOf(req.Model, f.metas(client))
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error(), "service_unavailable", "", "model_unavailable")
		return
	}
	limit := f.maxModelLen(client)
	prompts, err := parsePrompts(&req, chat, limit, tx)
	if err != nil {
		refuse(err)
		return
	}
	if len(prompts)*p.n > MaxChoices {
		refuse(invalid("n", "invalid_n", "prompts times n must be at most %d", MaxChoices))
		return
	}
	budgets := make([]int, len(prompts))
	for i, pr := range prompts {
		if budgets[i], err = p.maxTokens(len(pr.tokens), limit, f.opts.DefaultMaxTokens); err != nil {
			refuse(err)
			return
		}
	}
	_ = client.SetMigrationLimit(f.migrationLimit(client)) // never below 0
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		deadlineExceeded(w) // spent before anything was sent (reading, tokenizing)
		return
	}
	// A place on a worker, or a wait in the model's queue for one.
	place, err := f.gateOf(req.Model).admit(r.Context(), deadline, f.stopping)
	if err != nil {
		f.notAdmitted(w, req.Model, len(prompts)*p.n, err)
		return
	}

	// One worker request per choice, all under the request's id.
	choices := make([]*choice, 0, len(prompts)*p.n)
	killAll := func() {
		for _, c := range choices {
			if s := c.stream(); s != nil {
				s.Kill() // no-op once it ended; releases it otherwise
			}
		}
	}
	for i, pr := range prompts {
		for j := 0; j < p.n; j++ {
			c := &choice{index: i*p.n + j, reqCtx: f.rt.NewContext(id), stop: stopper{stops: p.stops}, text: tx.decoder(pr.tokens)}
			if !deadline.IsZero() {
				c.reqCtx.SetDeadline(deadline) // travels to every hop as time left
			}
			payload := p.payload(req.Model, pr.tokens, budgets[i], c.index)
			c.resend = func() (*plane.Stream, error) { return client.Generate(payload, c.reqCtx, plane.RoundRobin, 0) }
			var opts []plane.GenerateOption
			if place != nil {
				// The first choice goes into the request's place (and owns it).
				opts, place = append(opts, plane.WithReservation(place)), nil
			}
			var s *plane.Stream
			s, err = client.Generate(payload, c.reqCtx, plane.RoundRobin, 0, opts...)
			if err == nil {
				c.st.Store(s)
			}
			if err != nil {
				killAll()
				if errors.Is(err, plane.ErrTooLarge) {
					tooLarge(w, err.Error())
					return
				}
				writeError(w, http.StatusInternalServerError, err.Error(), "internal_error", "", "internal_error")
				return
			}
			choices = append(choices, c)
			f.metrics.request(req.Model)
		}
	}
	defer f.track(choices)()
	promptTokens := 0
	for _, pr := range prompts {
		promptTokens += len(pr.tokens)
	}
	prompts = nil

	// A client that goes away kills the requests: each context is the
	// request's context, so the kill reaches the worker (and its prefill
	// call) at once. once: a run started by the AfterFunc and the check
	// below never both count it, and the check waits for a run in progress
	// (Do returns only when f has), so the pending entry exists before the
	// streams are killed. A choice whose stream is complete (written out, or
	// ended by the worker) cancelled nothing.
	out := &stallWriter{w: w, ctl: ctl, stall: f.opts.WriteStallTimeout}
	// The response loop's context: r.Context(), and also cancelled by the
	// disconnect handler before it kills anything. A stream that the
	// handler killed ends as cleanly as a finished one; the loop must see
	// the client gone first, or it answers the killed request as finished
	// (finish_reason, [DONE]) to a client that half-closed and still reads.
	// r.Context() alone does not order them: the AfterFunc's goroutine may
	// run before net/http's cancel reaches the loop's context.
	respCtx, clientGone := context.WithCancel(r.Context())
	defer clientGone()
	var once sync.Once
	onDisconnect := func() {
		clientGone()
		once.Do(func() {
			for _, c := range choices {
				// Complete as the client saw it, or as the worker ended it
				// (its final frame is here, not yet written out).
				if !c.complete.Load() && !c.stream().Completed() {
					f.disconnected(c.reqCtx, c.stream(), id, req.Model)
				}
			}
		})
	}
	stopWatching := context.AfterFunc(r.Context(), onDisconnect)
	// A panic from here on (a bug; recoverPanic answers it) must neither
	// leave the watcher to take net/http's cancel of the request's context,
	// after the handler, for a client's disconnect (counted, logged, the
	// workers told client_disconnected), nor leave the streams to it.
	defer func() {
		if p := recover(); p != nil {
			stopWatching()
			killAll()
			panic(p)
		}
	}()
	if testHookBeforeResponse != nil {
		testHookBeforeResponse()
	}

	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	resp := &response{
		f: f, w: out, ctx: respCtx, plan: p, choices: choices, id: prefix + id, model: req.Model,
		created: time.Now().Unix(), promptTokens: promptTokens,
	}
	if req.Stream {
		resp.stream()
	} else {
		resp.unary()
	}
	// The response loop may have seen the disconnect (its reads use the
	// request's context) before the AfterFunc ran, or a write may have
	// failed or stalled: count it either way, once.
	stopWatching()
	// respCtx done: a run of onDisconnect started (it may still be
	// registering the pending aborts): wait for it (once) before killAll.
	if respCtx.Err() != nil || r.Context().Err() != nil || out.failed {
		onDisconnect()
	}
	killAll()
	for _, c := range choices {
		f.metrics.outcome(req.Model, c.outcome())
	}
}

// testHookBeforeResponse, when set (by tests only), runs in serve once the
// worker requests are sent, before the response is written.
var testHookBeforeResponse func()

// readBody reads at most limit bytes of body (a *http.MaxBytesError past
// that). The buffer grows as bytes arrive, never past a declared length
// within the limit: a client that declares a large body and sends little of
// it holds little (firstBodyChunk), at most 4 times what it sent. The
// buffer doubles until a quarter of the declared length has arrived, then
// takes the whole length, so the largest accepted body costs 1.25 times its
// size at that step and half its size in garbage before it.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, limit)
	n := r.ContentLength
	if n < 0 || n > limit {
		return io.ReadAll(body)
	}
	buf := make([]byte, 0, min(n, firstBodyChunk))
	for int64(len(buf)) < n {
		if len(buf) == cap(buf) {
			size := min(n, 2*int64(cap(buf)))
			if 4*int64(len(buf)) >= n {
				size = n
			}
			grown := make([]byte, len(buf), size)
			copy(grown, buf)
			buf = grown
		}
		m, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err == io.EOF && int64(len(buf)) < n {
			err = io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
	}
	return buf, nil
}

// firstBodyChunk is the buffer a body starts with (its declared length if
// smaller): what a connection that declared a body and sent none holds.
const firstBodyChunk = 16 << 10

// next waits for the stream's next item, or the request's end.
func next(ctx context.Context, s *plane.Stream) (workerItem, error) {
	raw, err := s.Next(ctx)
	if err != nil {
		return workerItem{}, err
	}
	it, err := tokens.ParseItem(raw)
	if err != nil {
		return workerItem{}, fmt.Errorf("worker sent a %w", err)
	}
	return it, nil
}
