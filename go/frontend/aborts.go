package frontend

import (
	"container/list"
	"fmt"
	"log/slog"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

type pendingAbort struct {
	key     string
	model   string
	at      time.Time
	age     *list.Element // in Frontend.byAge
	stream  *plane.Stream // whose current attempt's instance must confirm
	counted bool          // counted as a cancellation (mu held)
}

// onAbortConfirmed counts a worker's confirmation: only for a request
// waiting for one (by its Key, which only the plane and the worker know),
// and only from the instance its current attempt went to. Anything else (a
// late, stray or forged message) is ignored. A confirmation that arrives
// before the kill's outcome (see killOutcome) counts the cancellation too:
// there was something to abort.
func (f *Frontend) onAbortConfirmed(a plane.AbortConfirmation) {
	f.mu.Lock()
	p, known := f.pending[a.Key]
	ok := known && a.Instance != 0 && a.Instance == p.stream.Instance()
	countCancel := false
	if ok {
		f.forget(p)
		countCancel = !p.counted
		p.counted = true
	}
	f.mu.Unlock()
	if known && !ok {
		// A confirmation for a request we wait for, from another instance
		// than the one its current attempt went to: not counted.
		slog.Info("abort confirmation from another instance ignored", "request_id", a.ID, "request_key", a.Key,
			"instance", fmt.Sprintf("%x", a.Instance), "serving_instance", fmt.Sprintf("%x", p.stream.Instance()))
	}
	if ok {
		if countCancel {
			f.metrics.cancellation(p.model)
		}
		f.metrics.abortConfirmed(p.model, time.Since(p.at))
	}
}

// killOutcome counts a disconnect's kill as a cancellation once the plane
// knows it aborted something (see plane.Stream.KillOutcome): a kill that
// crossed the worker's end frame cancelled nothing, and its worker sends no
// confirmation, so it is forgotten.
func (f *Frontend) killOutcome(p *pendingAbort, aborted bool) {
	f.mu.Lock()
	if p.counted {
		f.mu.Unlock()
		return // the confirmation came first
	}
	if aborted {
		p.counted = true
	} else {
		f.forget(p)
	}
	f.mu.Unlock()
	if aborted {
		slog.Debug("cancellation counted, waiting for its confirmation", "request_key", p.key, "model", p.model)
		f.metrics.cancellation(p.model)
	} else {
		slog.Debug("client disconnected after the worker had finished: nothing cancelled", "request_key", p.key, "model", p.model)
	}
}

// disconnected kills the request of a client that went away and records it
// as a cancellation waiting for the worker's confirmation.
func (f *Frontend) disconnected(reqCtx *ctxtree.Context, s *plane.Stream, id, model string) {
	if reqCtx.IsKilled() {
		return
	}
	key := s.Key()
	f.mu.Lock()
	// Registered before the kill, so that no confirmation can arrive first.
	p := f.remember(&pendingAbort{key: key, model: model, at: time.Now(), stream: s})
	f.mu.Unlock()
	if !reqCtx.Cancel(ctxtree.Killed, ctxtree.ReasonClientDisconnected) {
		f.mu.Lock()
		f.forget(p)
		f.mu.Unlock()
		return
	}
	slog.Info("client disconnected: request killed", "request_id", id, "request_key", key, "model", model)
	// Counted as a cancellation when the kill's outcome is known: at the
	// worker's close (or its confirmation), about one round trip from now.
	s.KillOutcome(func(aborted bool) { f.killOutcome(p, aborted) })
}

// remember puts p in the pending table (mu held) and returns it. Entries
// never confirmed (the worker finished first, or died) are forgotten after
// pendingTTL, oldest first, as later ones arrive: O(1) per disconnect.
func (f *Frontend) remember(p *pendingAbort) *pendingAbort {
	for e := f.byAge.Front(); e != nil && p.at.Sub(e.Value.(*pendingAbort).at) > pendingTTL; e = f.byAge.Front() {
		f.forget(e.Value.(*pendingAbort))
	}
	f.forget(f.pending[p.key]) // keys are the plane's, unique; a second entry replaces the first
	f.pending[p.key] = p
	p.age = f.byAge.PushBack(p)
	return p
}

// forget drops p from the pending table (mu held); p may be nil or gone.
func (f *Frontend) forget(p *pendingAbort) {
	if p == nil || p.age == nil {
		return
	}
	f.byAge.Remove(p.age)
	p.age = nil
	if f.pending[p.key] == p {
		delete(f.pending, p.key)
	}
}

// pendingTTL bounds how long a disconnect waits for its confirmation before
// it is forgotten, so the table cannot grow without bound.
const pendingTTL = 5 * time.Minute
