//go:build linux

// Package logqueue is where the library's log records go, since it never
// writes to stdout or stderr: an slog.Handler that formats records into a
// bounded queue whose fd the host watches (the Python side drains it into
// the "dynamo_ctx" logger). Levels are Python's logging levels.
package logqueue

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dynamo-ctx/dynamo-ctx/go/wake"
)

// Levels on the host side are Python's logging levels.
const (
	Debug   = 10
	Info    = 20
	Warning = 30
	Error   = 40

	maxQueuedRecords = 10000
	maxRecordBytes   = 16 << 10
)

// Record is one formatted log record.
type Record struct {
	Level int // a Python level
	Msg   string
}

// Queue holds the records until the host takes them. A nil *Queue is usable:
// its Handler drops every record and it never has one to take.
type Queue struct {
	q        *wake.Queue[Record]
	minLevel atomic.Int64 // Python level below which records are not even formatted
	dropped  atomic.Int64
	readMu   sync.Mutex // serialises Next
}

// New creates an empty queue that takes records of level Warning and up.
func New() (*Queue, error) {
	q, err := wake.New[Record]()
	if err != nil {
		return nil, err
	}
	l := &Queue{q: q}
	l.minLevel.Store(Warning)
	return l, nil
}

// Fd is readable while records are waiting.
func (l *Queue) Fd() int { return l.q.Fd() }

// SetLevel sets the lowest Python level of the records queued.
func (l *Queue) SetLevel(level int) { l.minLevel.Store(int64(level)) }

// Next passes the oldest record to take and removes it if take returns true
// (false leaves it first in line, e.g. when the host's buffer is too small).
// It reports false if no record is waiting. One caller at a time gets in, so
// the record take saw is the one removed.
func (l *Queue) Next(take func(Record) bool) bool {
	if l == nil {
		return false
	}
	l.readMu.Lock()
	defer l.readMu.Unlock()
	rec, ok := l.q.Peek()
	if !ok {
		return false
	}
	if take(rec) {
		var one [1]Record
		l.q.Drain(one[:])
	}
	return true
}

// Handler is the slog.Handler that queues records (see slog.SetDefault).
func (l *Queue) Handler() slog.Handler { return handler{l: l} }

func pyLevel(lv slog.Level) int {
	switch {
	case lv >= slog.LevelError:
		return Error
	case lv >= slog.LevelWarn:
		return Warning
	case lv >= slog.LevelInfo:
		return Info
	}
	return Debug
}

type handler struct {
	l     *Queue
	attrs string // pre-formatted " k=v" pairs from WithAttrs
	group string
}

func (h handler) Enabled(_ context.Context, lv slog.Level) bool {
	return h.l != nil && int64(pyLevel(lv)) >= h.l.minLevel.Load()
}

func (h handler) Handle(_ context.Context, r slog.Record) error {
	if h.l == nil {
		return nil
	}
	var b strings.Builder
	b.WriteString(r.Message)
	b.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		writeAttr(&b, h.group, a)
		return true
	})
	msg := b.String()
	if len(msg) > maxRecordBytes {
		msg = msg[:maxRecordBytes] + "...(truncated)"
	}
	q := h.l.q
	if q.Len() >= maxQueuedRecords {
		h.l.dropped.Add(1)
		return nil
	}
	if n := h.l.dropped.Swap(0); n > 0 {
		_ = q.Push(Record{Warning, fmt.Sprintf("%d log records dropped: nobody drained the log queue", n)})
	}
	return q.Push(Record{pyLevel(r.Level), msg})
}

func writeAttr(b *strings.Builder, group string, a slog.Attr) {
	b.WriteByte(' ')
	if group != "" {
		b.WriteString(group)
		b.WriteByte('.')
	}
	b.WriteString(a.Key)
	b.WriteByte('=')
	b.WriteString(fmt.Sprintf("%q", a.Value.String()))
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(h.attrs)
	for _, a := range as {
		writeAttr(&b, h.group, a)
	}
	return handler{l: h.l, attrs: b.String(), group: h.group}
}

func (h handler) WithGroup(name string) slog.Handler {
	g := name
	if h.group != "" {
		g = h.group + "." + name
	}
	return handler{l: h.l, attrs: h.attrs, group: g}
}
