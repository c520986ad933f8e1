package frontend

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
)

// writeJSON answers 200 with v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers with an OpenAI-shaped error: {"error": {"message",
// "type", "param", "code"}}. param may be empty (null). The request is
// logged as failed (see recorder).
func writeError(w http.ResponseWriter, status int, msg, kind, param, code string) {
	failed(w, status, msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var p any
	if param != "" {
		p = param
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": kind, "param": p, "code": code}})
}

// failed records why a request failed, for its log line; a failure in a
// response already under way (an error event in a stream) is recorded
// with the status it would have had.
func failed(w http.ResponseWriter, status int, reason string) {
	if rec, ok := w.(*recorder); ok && rec.reason == "" {
		rec.failStatus, rec.reason = status, reason
	}
}

// recorder sees a response's status and the reason it failed, so that each
// failed request is logged once, when it is over: at WARNING for a client
// error (4xx), at ERROR for a server error. A client that disconnects is no
// failure (it is logged at INFO as a cancellation).
type recorder struct {
	http.ResponseWriter
	status     int
	failStatus int
	reason     string
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *recorder) logFailure(req *http.Request) {
	status := r.failStatus
	if status == 0 && r.status >= 400 {
		status = r.status
	}
	if status == 0 {
		return
	}
	level := slog.LevelWarn
	if status >= 500 && status != http.StatusServiceUnavailable && status != http.StatusGatewayTimeout {
		// A fault of the stack's. Overload, shutdown and a deadline (503,
		// 504) are how it works under load: warnings.
		level = slog.LevelError
	}
	slog.Log(context.Background(), level, "request failed", "status", status,
		"request_id", r.Header().Get("x-request-id"), "method", req.Method, "path", req.URL.Path, "reason", r.reason)
}

// recoverPanic turns a handler's panic into a 500 (if nothing was sent
// yet) and an ERROR log, instead of a dropped connection.
func (r *recorder) recoverPanic(req *http.Request) {
	p := recover()
	if p == nil {
		return
	}
	if p == http.ErrAbortHandler {
		panic(p)
	}
	slog.Error("panic serving a request", "path", req.URL.Path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	if r.status == 0 {
		writeError(r, http.StatusInternalServerError, "internal error", "internal_error", "", "internal_error")
	} else {
		failed(r, http.StatusInternalServerError, fmt.Sprint("panic: ", p))
		panic(http.ErrAbortHandler) // the response is cut: the client must see it broken
	}
}

// noRoute answers a request no route takes with OpenAI's error shape: 404
// for an unknown path, 405 (with the Allow header the mux sets) for a known
// path and the wrong method.
func noRoute(w http.ResponseWriter, r *http.Request, mux *http.ServeMux) {
	h, _ := mux.Handler(r)
	probe := &statusProbe{header: w.Header()}
	h.ServeHTTP(probe, r)
	switch probe.status {
	case http.StatusMethodNotAllowed:
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, w.Header().Get("Allow")),
			"invalid_request_error", "", "method_not_allowed")
	case http.StatusNotFound, 0:
		writeError(w, http.StatusNotFound, fmt.Sprintf("unknown path: %s %s", r.Method, r.URL.Path), "invalid_request_error", "", "unknown_url")
	default: // a redirect (path cleaning): its headers are set already
		w.WriteHeader(probe.status)
	}
}

// statusProbe runs the mux's own answer for an unrouted request (404, 405
// with Allow, a redirect) to learn its status and headers; its body is
// dropped.
type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header { return p.header }

func (p *statusProbe) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}

func (p *statusProbe) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return len(b), nil
}

func badRequest(w http.ResponseWriter, msg, param, code string) {
	writeError(w, http.StatusBadRequest, msg, "invalid_request_error", param, code)
}

func modelNotFound(w http.ResponseWriter, model string) {
	writeError(w, http.StatusNotFound, fmt.Sprintf("model %q is not served by any worker", model), "invalid_request_error", "model", "model_not_found")
}

func tooLarge(w http.ResponseWriter, msg string) {
	writeError(w, http.StatusRequestEntityTooLarge, msg, "invalid_request_error", "", "request_too_large")
}
