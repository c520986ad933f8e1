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
	"github.com/dynamo-ctx/dynamo-ctx/go/killtrace"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/tokens"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
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
			return "", fmt.Errorf("the %s header is not a valid id: %w", h, err)
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
	// send sends the worker request again, into place if not nil, and
	// readmit waits for a place for it (resend.go); resends counts the
	// times it was sent again; refused is the outcome of a choice that got
	// no place when it was readmitted ("" otherwise).
	send    func(place *plane.Reservation) (*plane.Stream, error)
	readmit func(ctx context.Context) (*plane.Reservation, error)
	resends int
	refused string
	// complete: the worker's stream ended normally, or the frontend ended
	// it at a stop string: a disconnect now cancels nothing.
	complete atomic.Bool
	ended    bool // no more items are read from it
	started  bool // a chunk of it was sent (the first carries the chat role)
	stop     stopper
	endErr   error   // how its stream ended, once it did (io.EOF: cleanly)
	text     decoder // the model's output as text
	tokens   int
	// minTokens: stop strings count only in the text of the tokens after
	// these (min_tokens).
	minTokens int
	lp        *logprobs       // the tokens' logprobs, when the request asks them
	echo      string          // echo: the prompt's text, which the first chunk starts with
	all       strings.Builder // the whole text, for a non-streaming response
	finish    string
	// held is a finish reason that does not complete the request (an
	// "abort" or "error": tokens.Completes): its finish chunk waits for the
	// stream's end, as a migration may still continue the request; more
	// tokens drop it.
	held string
	// parse reads a chat choice's reasoning and tool calls (chatparse.go;
	// nil: its text is the content); lastIDs are the ids of the item just
	// taken, ids all of them (for a non-streaming response).
	parse   *outputParse
	lastIDs []int
	ids     []int
}

// take applies an item to the choice; it returns the text to send and
// whether the choice's finish reason is now known.
func (c *choice) take(it workerItem) (string, bool) {
	if c.lp != nil {
		c.lp.add(it)
	}
	armed := c.tokens >= c.minTokens // this item's tokens are all past min_tokens
	c.tokens += len(it.TokenIDs)
	if c.parse != nil {
		c.lastIDs = it.TokenIDs
		c.ids = append(c.ids, it.TokenIDs...)
	}
	ids := it.TokenIDs
	if it.FinishReason != nil && *it.FinishReason == "stop" && !c.stop.include && len(ids) > 0 {
		// A stop token (EOS, stop_token_ids) ends the output: it is counted
		// but not text, as vLLM's detokenizer leaves it out, unless
		// include_stop_str_in_output.
		ids = ids[:len(ids)-1]
	}
	text, hit := c.stop.feedArmed(c.text.next(ids), armed)
	if hit {
		c.finish = "stop"
		return text, true
	}
	switch {
	case it.FinishReason != nil && !tokens.Completes(*it.FinishReason):
		c.held = *it.FinishReason
	case it.FinishReason != nil:
		c.finish = *it.FinishReason
		return text + c.stop.flush(), true
	case len(it.TokenIDs) > 0:
		c.held = ""
	}
	return text, false
}

// serve serves a completions (chat: chat completions) request: read and
// check it (parse), wait for a place on a worker (admit), send a worker
// request per choice (dispatch), then write the response from their streams
// (respond).
func (f *Frontend) serve(w http.ResponseWriter, r *http.Request, chat bool) {
	var in *incoming
	var choices []*choice
	span := traceStart(r, chat) // trace.go; nil while tracing is off
	if span != nil {
		defer func() { traceEnd(span, w, in, choices) }()
	}
	in, ok := f.parse(w, r, chat)
	if !ok {
		return
	}
	in.span = span
	traceParsed(span, in)
	place, ok := f.admit(w, r, in)
	if !ok {
		return
	}
	choices, ok = f.dispatch(w, in, place)
	if !ok {
		return
	}
	defer f.track(choices)()
	f.respond(w, r, in, choices)
}

// incoming is a request as parse read and checked it.
type incoming struct {
	id       string
	deadline time.Time // zero: none
	ctl      *http.ResponseController
	chat     bool
	req      *completionRequest
	plan     *plan
	client   *plane.Client // the model's instances that speak text
	gate     *gate         // their admission
	text     text          // the model's language
	prompts  []prompt      // dropped once the worker requests are sent (dispatch)
	budgets  []int         // each prompt's max_tokens
	// promptTokens is the number of the prompts' tokens (usage).
	promptTokens int
	span         *tracing.Span // the request's span (trace.go); nil: not traced
}

// parse reads the request and checks it: its id and deadline headers, its
// body (bounded, JSON, keys named exactly), the model, the OpenAI surface,
// the prompts in the model's tokens and their budgets. A request it
// refuses is answered, and ok is false.
func (f *Frontend) parse(w http.ResponseWriter, r *http.Request, chat bool) (in *incoming, ok bool) {
	start := time.Now()
	id, err := requestID(r)
	if err != nil {
		badRequest(w, err.Error(), "", "invalid_request_id")
		return nil, false
	}
	w.Header().Set("x-request-id", id)
	deadline, err := f.requestDeadline(r, start)
	if err != nil {
		badRequest(w, err.Error(), "", "invalid_request_timeout")
		return nil, false
	}
	ctl := http.NewResponseController(w)
	req, ok := f.readRequest(w, r, ctl)
	if !ok {
		return nil, false
	}
	p := &plan{req: req, chat: chat}
	if err := p.check(); err != nil {
		refuse(w, err)
		return nil, false
	}
	// The model's language: its own tokenizer and chat template, or the
	// stand-in; the request goes only to the instances that speak it
	// (text.go). Prompt sizes are checked before a text is expanded into
	// token ids, and prompt tokens + max_tokens must fit the model's
	// context length.
	tx, g, ok := f.textFor(w, req.Model)
	if !ok {
		return nil, false
	}
	client, gate, err := f.modelClient(route{model: req.Model, text: g.id})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error(), "service_unavailable", "", "service_unavailable")
		return nil, false
	}
	if client.NumInstances() == 0 {
		modelNotFound(w, req.Model)
		return nil, false
	}
	if err := p.checkExtensions(req.Model, tx, g.cards); err != nil {
		refuse(w, err)
		return nil, false
	}
	limit := f.maxModelLen(req.Model)
	prompts, err := parsePrompts(req, chat, limit, tx)
	if err != nil {
		refuse(w, err)
		return nil, false
	}
	if len(prompts)*p.n > MaxChoices {
		refuse(w, invalid("n", "invalid_n", "prompts times n must be at most %d", MaxChoices))
		return nil, false
	}
	in = &incoming{id: id, deadline: deadline, ctl: ctl, chat: chat, req: req, plan: p, client: client, gate: gate, text: tx,
		prompts: prompts, budgets: make([]int, len(prompts))}
	for i, pr := range prompts {
		if in.budgets[i], err = p.maxTokens(len(pr.tokens), limit, f.opts.DefaultMaxTokens); err != nil {
			refuse(w, err)
			return nil, false
		}
		if err := req.minTokensFits(in.budgets[i]); err != nil {
			refuse(w, err)
			return nil, false
		}
		in.promptTokens += len(pr.tokens)
	}
	return in, true
}

// readRequest reads the body (at most Options.MaxBodyBytes) and decodes it,
// once its keys are found named exactly; then a model must be named. A
// request it refuses is answered, and ok is false.
func (f *Frontend) readRequest(w http.ResponseWriter, r *http.Request, ctl *http.ResponseController) (*completionRequest, bool) {
	req, ok := f.readBody(w, r, ctl)
	if ok && req.Model == "" {
		badRequest(w, "model is required", "model", "missing_model")
		return nil, false
	}
	return req, ok
}

// readBody is readRequest but for the model, which it does not require.
func (f *Frontend) readBody(w http.ResponseWriter, r *http.Request, ctl *http.ResponseController) (*completionRequest, bool) {
	body, err := readBody(w, r, f.opts.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			tooLarge(w, fmt.Sprintf("the request body exceeds %d bytes", mbe.Limit))
			return nil, false
		}
		badRequest(w, "could not read the request body", "", "invalid_body")
		return nil, false
	}
	// The body is read: the read deadline (there for slow senders) must not
	// cut a long response, nor make the server's background read (which
	// notices a disconnect) fail while the response is streaming.
	_ = ctl.SetReadDeadline(time.Time{})
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, "the request body is not valid JSON: "+err.Error(), "", "invalid_json")
		return nil, false
	}
	if re := checkKeys(body); re != nil {
		badRequest(w, re.msg, re.param, re.code)
		return nil, false
	}
	return &req, true
}

// refuse answers a request whose content parse refused: 400 with the
// requestError's param and code, if it is one.
func refuse(w http.ResponseWriter, err error) {
	var re *requestError
	if errors.As(err, &re) {
		badRequest(w, re.msg, re.param, re.code)
		return
	}
	badRequest(w, err.Error(), "", "invalid_request")
}

// admit waits for a place on a worker of the model, or in the model's
// queue for one (admission.go), unless the deadline is already spent. A
// request it refuses is answered, and ok is false; the place may be nil
// (no bound on the model's places).
func (f *Frontend) admit(w http.ResponseWriter, r *http.Request, in *incoming) (place *plane.Reservation, ok bool) {
	_ = in.client.SetMigrationLimit(f.migrationLimit(in.req.Model)) // never below 0
	if !in.deadline.IsZero() && !time.Now().Before(in.deadline) {
		deadlineExceeded(w) // spent before anything was sent (reading, tokenizing)
		return nil, false
	}
	place, err := in.gate.admit(r.Context(), in.deadline, f.stopping, false)
	if err != nil {
		f.notAdmitted(w, in.req.Model, len(in.prompts)*in.plan.n, err)
		return nil, false
	}
	return place, true
}

// dispatch sends one worker request per choice, all under the request's
// id and deadline, the first into place. If one cannot be sent, those sent
// are killed, the request is answered, and ok is false. The prompts are
// dropped once sent.
func (f *Frontend) dispatch(w http.ResponseWriter, in *incoming, place *plane.Reservation) (choices []*choice, ok bool) {
	p := in.plan
	choices = make([]*choice, 0, len(in.prompts)*p.n)
	for i, pr := range in.prompts {
		for j := 0; j < p.n; j++ {
			c := &choice{index: i*p.n + j, reqCtx: f.rt.NewContext(in.id), stop: stopper{stops: p.stops, include: p.req.IncludeStopStrInOutput},
				text: in.text.decoder(pr.tokens, p.skipSpecial), minTokens: p.minTokens()}
			c.parse, _ = p.outputParse(in.text, pr.tokens) // checked by parse (checkParsers)
			if p.logprobsK >= 0 {
				c.lp = &logprobs{k: p.logprobsK}
				if p.req.Echo {
					c.lp.prompt = pr.tokens
				}
			}
			if p.req.Echo { // the prompt's text first, outside the stop strings' reach
				c.echo = pr.text
				if c.echo == "" {
					c.echo = in.text.detokenize(pr.tokens)
				}
				c.all.WriteString(c.echo)
			}
			if !in.deadline.IsZero() {
				c.reqCtx.SetDeadline(in.deadline) // travels to every hop as time left
			}
			traceChoice(in.span, c.reqCtx)
			payload := p.payload(in.req.Model, pr.tokens, in.budgets[i], c.index)
			client, gate := in.client, in.gate
			c.send = func(place *plane.Reservation) (*plane.Stream, error) {
				if place == nil {
					return client.Generate(payload, c.reqCtx, plane.RoundRobin, 0)
				}
				return client.Generate(payload, c.reqCtx, plane.RoundRobin, 0, plane.WithReservation(place))
			}
			c.readmit = func(ctx context.Context) (*plane.Reservation, error) {
				f.metrics.busyRequeue(in.req.Model)
				return gate.admit(ctx, in.deadline, f.stopping, true)
			}
			var opts []plane.GenerateOption
			if place != nil {
				// The first choice goes into the request's place (and owns it).
				opts, place = append(opts, plane.WithReservation(place)), nil
			}
			s, err := client.Generate(payload, c.reqCtx, plane.RoundRobin, 0, opts...)
			if err != nil {
				killAll(choices)
				if errors.Is(err, plane.ErrTooLarge) {
					tooLarge(w, err.Error())
					return nil, false
				}
				writeError(w, http.StatusInternalServerError, err.Error(), "internal_error", "", "internal_error")
				return nil, false
			}
			c.st.Store(s)
			choices = append(choices, c)
			f.metrics.request(in.req.Model)
		}
	}
	in.prompts = nil
	return choices, true
}

// killAll kills the choices' worker requests: a no-op for one that ended;
// it releases one that did not.
func killAll(choices []*choice) {
	for _, c := range choices {
		if s := c.stream(); s != nil {
			s.Kill()
		}
	}
}

// respond writes the response from the choices' streams (streaming or
// not), watching for the client going away, then kills what still runs
// and counts each choice's outcome.
func (f *Frontend) respond(w http.ResponseWriter, r *http.Request, in *incoming, choices []*choice) {
	model := in.req.Model
	// A client that goes away kills the requests: each context is the
	// request's context, so the kill reaches the worker (and its prefill
	// call) at once. once: a run started by the AfterFunc and the check
	// below never both count it, and the check waits for a run in progress
	// (Do returns only when f has), so the pending entry exists before the
	// streams are killed. A choice whose stream is complete (written out, or
	// ended by the worker) cancelled nothing.
	out := &stallWriter{w: w, ctl: in.ctl, stall: f.opts.WriteStallTimeout, h: f.hangups}
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
		killtrace.Mark("frontend.client_gone", in.id) // net/http or the hang-up watcher saw the client go
		clientGone()
		once.Do(func() {
			for _, c := range choices {
				// Complete as the client saw it, or as the worker ended it
				// (its final frame is here, not yet written out).
				if !c.complete.Load() && !c.stream().Completed() {
					f.disconnected(c.reqCtx, c.stream(), in.id, model)
				}
			}
		})
	}
	afterFunc := context.AfterFunc(r.Context(), onDisconnect)
	stopHangup := f.watchHangup(r.Context(), onDisconnect) // sooner than net/http under load
	stopWatching := func() bool {
		stopHangup()
		return afterFunc()
	}
	// A panic from here on (a bug; recoverPanic answers it) must neither
	// leave the watcher to take net/http's cancel of the request's context,
	// after the handler, for a client's disconnect (counted, logged, the
	// workers told client_disconnected), nor leave the streams to it.
	defer func() {
		if p := recover(); p != nil {
			stopWatching()
			killAll(choices)
			panic(p)
		}
	}()
	if testHookBeforeResponse != nil {
		testHookBeforeResponse()
	}

	prefix := "cmpl-"
	if in.chat {
		prefix = "chatcmpl-"
	}
	resp := &response{
		f: f, w: out, ctx: respCtx, plan: in.plan, choices: choices, id: prefix + in.id, model: model,
		created: time.Now().Unix(), promptTokens: in.promptTokens, text: in.text,
	}
	switch err := resp.started(); {
	case err != nil:
		if respCtx.Err() == nil {
			f.answerNotAdmitted(w, model, err) // nothing was written yet
		}
	case in.req.Stream:
		resp.stream()
	default:
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
	killAll(choices)
	for _, c := range choices {
		f.metrics.outcome(model, c.outcome())
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
