package frontend

// Detokenize is the frontend's stand-in detokenizer, for tests that check the
// text a request produced.
func Detokenize(ids []int) string { return standInDecoder{}.next(ids) }

// StopText feeds pieces of text to a stop-string matcher and returns what it
// lets through (the held-back rest included when no stop string was found),
// and whether one was found.
func StopText(stops, pieces []string) (string, bool) {
	s := stopper{stops: stops}
	var out string
	for _, p := range pieces {
		t, hit := s.feed(p)
		out += t
		if hit {
			return out, true
		}
	}
	return out + s.flush(), false
}

// IdleConnections returns how many connections the frontend holds that are
// not serving a request, and how many it closed for its bound.
func IdleConnections(f *Frontend) (held int, closed int64) { return f.srv.IdleConnections() }

// PanicBeforeResponse makes every completion request panic once its worker
// requests are sent, until the returned function is called: a stand-in for
// a bug in the response code.
func PanicBeforeResponse() (restore func()) {
	testHookBeforeResponse = func() { panic("test: a bug in the response code") }
	return func() { testHookBeforeResponse = nil }
}

// Loaded returns how many models' texts the frontend keeps, and how many
// routes (a model's instances of one text, with their client and gate).
func Loaded(f *Frontend) (texts, routes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.texts.loaded(), len(f.clients)
}
