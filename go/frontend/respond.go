package frontend

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// event is an item (or the end) of one choice's stream.
type event struct {
	c    *choice
	item workerItem
	err  error
}

// pump reads every choice's stream into one channel until ctx ends; wait
// returns when the readers have.
func pump(ctx context.Context, choices []*choice) (events <-chan event, wait func()) {
	ch := make(chan event)
	var wg sync.WaitGroup
	for _, c := range choices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				it, err := c.next(ctx)
				select {
				case ch <- event{c: c, item: it, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	return ch, wg.Wait
}

// errShutdown ends a response whose worker requests Drain killed.
var errShutdown = errors.New("the frontend is shutting down and its drain timeout passed")

// stallWriter writes a response with a deadline on every write: a client
// that stops reading for the stall timeout is treated as gone.
type stallWriter struct {
	w      http.ResponseWriter
	ctl    *http.ResponseController
	stall  time.Duration
	armed  time.Time // when the write deadline was last pushed back
	failed bool
	h      *hangups // told of every flush (hangups.touch); nil: none
}

// arm pushes the write deadline back; at most once a second (the deadline
// is then between stall-1s and stall away), so a fast stream does not pay
// for it per token.
func (s *stallWriter) arm() {
	if now := time.Now(); now.Sub(s.armed) >= time.Second {
		s.armed = now
		_ = s.ctl.SetWriteDeadline(now.Add(s.stall))
	}
}

func (s *stallWriter) Write(b []byte) (int, error) {
	if s.failed {
		return 0, io.ErrClosedPipe
	}
	s.arm()
	n, err := s.w.Write(b)
	if err != nil {
		s.failed = true
	}
	return n, err
}

// Flush sends what is buffered; false once the client is gone or stalled.
func (s *stallWriter) Flush() bool {
	if s.failed {
		return false
	}
	s.arm()
	if s.h != nil {
		s.h.touch() // the hang-up watcher polls while responses write
	}
	if err := s.ctl.Flush(); err != nil {
		s.failed = true
	}
	return !s.failed
}

// response writes the answer to one HTTP request from its choices' streams.
type response struct {
	f            *Frontend
	w            *stallWriter
	ctx          context.Context // the request's, also done when its client is gone (serve)
	plan         *plan
	choices      []*choice
	id, model    string
	created      int64
	promptTokens int
	chunkTail    []byte // what follows the choice in each chunk (appendChunk)
	text         text   // the model's, for logprobs' token texts
}

func (p *response) object() string {
	switch {
	case p.plan.chat && p.plan.req.Stream:
		return "chat.completion.chunk"
	case p.plan.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (p *response) usage() map[string]any {
	completion := 0
	for _, c := range p.choices {
		completion += c.tokens
	}
	u := map[string]any{"prompt_tokens": p.promptTokens, "completion_tokens": completion, "total_tokens": p.promptTokens + completion}
	if p.plan.chat && p.plan.reasoningParser != "" {
		// As vLLM's server with a reasoning parser: the reasoning's tokens.
		reasoning := 0
		for _, c := range p.choices {
			if c.parse != nil && c.parse.reason != nil {
				reasoning += c.parse.reason.CountReasoningTokens(c.ids)
			}
		}
		u["completion_tokens_details"] = map[string]any{"reasoning_tokens": reasoning}
	}
	return u
}

// run reads the choices' streams until all have ended, calling on for every
// item of a choice still running; it returns the first error (io.EOF when
// all ended normally, the request's context's error on a disconnect).
func (p *response) run(on func(c *choice, text string, finished bool) error) error {
	ctx, cancel := context.WithCancel(p.ctx)
	var recv func() (event, bool) // false: ctx is done
	if len(p.choices) == 1 {
		// One choice (n=1, the usual case): read it here, without a pump
		// goroutine and its hand-off per token.
		c := p.choices[0]
		recv = func() (event, bool) {
			it, err := c.next(ctx)
			if err != nil && ctx.Err() != nil {
				return event{}, false
			}
			return event{c: c, item: it, err: err}, true
		}
		defer cancel()
	} else {
		events, wait := pump(ctx, p.choices)
		defer wait()
		defer cancel()
		recv = func() (event, bool) {
			select {
			case ev := <-events:
				return ev, true
			case <-ctx.Done():
				return event{}, false
			}
		}
	}
	running := len(p.choices)
	for running > 0 {
		ev, ok := recv()
		if !ok || ctx.Err() != nil {
			// Gone: a pump's event can win the select over ctx.Done(), and
			// a stream the disconnect killed ends as cleanly as a finished one.
			return ctx.Err()
		}
		c := ev.c
		if c.ended {
			continue // ended by the frontend at a stop string
		}
		if ev.err != nil && c.endErr == nil {
			c.endErr = ev.err
		}
		if ev.err != nil && !c.stream().Completed() {
			if byDeadline(c) {
				return errDeadline
			}
			if c.reqCtx.Reason() == ctxtree.ReasonShutdown {
				return errShutdown
			}
		}
		if ev.err == io.EOF {
			c.ended = true
			running--
			c.complete.Store(!c.stream().Context().IsStopped())
			if c.finish == "" { // the reason take held back, else none: "stop"
				c.finish = cmp.Or(c.held, "stop")
				c.lastIDs = nil
				if err := on(c, c.stop.flush(), true); err != nil {
					return err
				}
			}
			continue
		}
		if ev.err != nil {
			if p.ctx.Err() != nil {
				return p.ctx.Err()
			}
			return ev.err
		}
		text, finished := c.take(ev.item)
		if finished && c.finish == "stop" && c.stop.hit {
			// A stop string: the rest of this choice is not wanted.
			c.ended = true
			running--
			c.complete.Store(true)
			c.stream().Kill()
		}
		if err := on(c, text, finished); err != nil {
			return err
		}
	}
	return io.EOF
}

// streamChunk is one event of a streamed response. Its fields are in the
// order a map's keys would be written (alphabetical), as before it was a
// struct: typed, it is encoded without a map per token.
type streamChunk struct {
	Choices any `json:"choices"` // []chunkChoice, or []parsedChoice

	Created int64  `json:"created"`
	ID      string `json:"id"`
	Model   string `json:"model"`
	Object  string `json:"object"`
}

// streamChunkUsage is streamChunk with "usage" (stream_options.include_usage:
// null in every chunk but the last).
type streamChunkUsage struct {
	Choices any    `json:"choices"`
	Created int64  `json:"created"`
	ID      string `json:"id"`
	Model   string `json:"model"`
	Object  string `json:"object"`
	Usage   any    `json:"usage"`
}

// chunkChoice is a choice of a chunk: "delta" for chat, "text" for
// completions.
type chunkChoice struct {
	Delta        *chunkDelta `json:"delta,omitempty"`
	FinishReason *string     `json:"finish_reason"`
	Index        int         `json:"index"`
	Text         *string     `json:"text,omitempty"`
	Logprobs     any         `json:"logprobs,omitempty"`
}

type chunkDelta struct {
	Content string `json:"content"`
	Role    string `json:"role,omitempty"`
}

func (p *response) chunk(choices any, usage any) []byte {
	var b []byte
	if p.plan.includeUsage {
		b, _ = json.Marshal(streamChunkUsage{Choices: choices, Created: p.created, ID: p.id, Model: p.model, Object: p.object(), Usage: usage})
	} else {
		b, _ = json.Marshal(streamChunk{Choices: choices, Created: p.created, ID: p.id, Model: p.model, Object: p.object()})
	}
	return b
}

// appendChunk appends the bytes of p.chunk([]chunkChoice{ch}, nil), one
// token's event, without encoding/json's reflection: everything after the
// choice is the same for every chunk of the response and encoded once.
func (p *response) appendChunk(b []byte, ch chunkChoice) []byte {
	if p.chunkTail == nil {
		p.chunkTail = p.chunk([]chunkChoice{}, nil)[len(`{"choices":[`):] // `],"created":...}`
	}
	b = append(b, `{"choices":[{`...)
	if ch.Delta != nil {
		b = append(b, `"delta":{"content":`...)
		b = appendJSONString(b, ch.Delta.Content)
		if ch.Delta.Role != "" {
			b = append(b, `,"role":`...)
			b = appendJSONString(b, ch.Delta.Role)
		}
		b = append(b, `},`...)
	}
	b = append(b, `"finish_reason":`...)
	if ch.FinishReason == nil {
		b = append(b, `null`...)
	} else {
		b = appendJSONString(b, *ch.FinishReason)
	}
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(ch.Index), 10)
	if ch.Text != nil {
		b = append(b, `,"text":`...)
		b = appendJSONString(b, *ch.Text)
	}
	b = append(b, '}')
	return append(b, p.chunkTail...)
}

// appendJSONString appends s as encoding/json encodes a string: as it is
// when it is printable ASCII that needs no escape (HTML's <, > and & are
// escaped by encoding/json), else by encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func (p *response) stream() {
	w := p.w
	w.w.Header().Set("Content-Type", "text/event-stream")
	w.w.Header().Set("Cache-Control", "no-cache")
	w.w.WriteHeader(http.StatusOK)
	if !w.Flush() {
		return
	}
	var buf []byte // one event, reused
	err := p.run(func(c *choice, text string, finished bool) error {
		if c.parse != nil {
			return p.sendParsed(c, text, finished, &buf)
		}
		if text == "" && !finished && c.started {
			return nil
		}
		if !c.started {
			text = c.echo + text
		}
		ch := chunkChoice{Index: c.index}
		if finished {
			ch.FinishReason = &c.finish
		}
		if p.plan.chat {
			ch.Delta = &chunkDelta{Content: text}
			if !c.started {
				ch.Delta.Role = "assistant"
			}
		} else {
			ch.Text = &text
		}
		c.started = true
		buf = append(buf[:0], "data: "...)
		if c.lp != nil && (c.lp.sent < len(c.lp.all) || finished) {
			ch.Logprobs = c.lp.object(p.plan.chat, p.text)
			buf = append(buf, p.chunk([]chunkChoice{ch}, nil)...)
			buf = append(buf, "\n\n"...)
		} else {
			buf = append(p.appendChunk(buf, ch), "\n\n"...)
		}
		if _, err := w.Write(buf); err != nil {
			return err // the client is gone or stalled: serve kills the request
		}
		if !w.Flush() {
			return io.ErrClosedPipe
		}
		return nil
	})
	if err != io.EOF {
		if p.ctx.Err() == nil && !w.failed {
			msg, status, kind, code := err.Error(), http.StatusInternalServerError, "internal_error", "internal_error"
			switch {
			case errors.Is(err, errDeadline):
				status, kind, code = http.StatusGatewayTimeout, "timeout_error", "deadline_exceeded"
			case errors.Is(err, errShutdown):
				status, kind, code = http.StatusServiceUnavailable, "service_unavailable", "shutdown"
			}
			failed(w.w, status, msg)
			b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": kind, "param": nil, "code": code}})
			fmt.Fprintf(w, "data: %s\n\n", b)
			w.Flush()
		}
		return
	}
	if p.plan.includeUsage {
		fmt.Fprintf(w, "data: %s\n\n", p.chunk([]chunkChoice{}, p.usage()))
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	w.Flush()
}

func (p *response) unary() {
	err := p.run(func(c *choice, text string, finished bool) error {
		c.all.WriteString(text)
		return nil
	})
	if err != io.EOF {
		if p.ctx.Err() != nil {
			return // disconnected: nobody to answer
		}
		status, code := http.StatusInternalServerError, "internal_error"
		switch {
		case errors.Is(err, errDeadline):
			deadlineExceeded(p.w.w)
			return
		case errors.Is(err, errShutdown):
			writeError(p.w.w, http.StatusServiceUnavailable, err.Error(), "service_unavailable", "", "shutdown")
			return
		case errors.Is(err, plane.ErrNoResponders):
			status, code = http.StatusServiceUnavailable, "service_unavailable"
		case errors.Is(err, plane.ErrTooLarge):
			tooLarge(p.w.w, err.Error())
			return
		}
		writeError(p.w.w, status, err.Error(), code, "", code)
		return
	}
	out := make([]any, len(p.choices))
	for i, c := range p.choices {
		ch := map[string]any{"index": c.index, "finish_reason": c.finish}
		if c.lp != nil {
			ch["logprobs"] = c.lp.object(p.plan.chat, p.text)
		}
		if c.parse != nil {
			ch["message"], ch["finish_reason"] = p.parsedMessage(c)
		} else if p.plan.chat {
			ch["message"] = map[string]any{"role": "assistant", "content": c.all.String()}
		} else {
			ch["text"] = c.all.String()
		}
		out[i] = ch
	}
	p.w.w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(p.w).Encode(map[string]any{
		"id": p.id, "object": p.object(), "created": p.created, "model": p.model, "choices": out, "usage": p.usage(),
	})
}
