package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dynamo-ctx/dynamo-ctx/go/wake"
)

// The library never writes to stdout or stderr. Its log records (from slog,
// and from the standard log package, which slog.SetDefault redirects) go to
// a bounded queue whose fd the host watches; the Python side drains it into
// the "dynamo_ctx" logger.

// Levels on the C side are Python's logging levels.
const (
	pyDebug   = 10
	pyInfo    = 20
	pyWarning = 30
	pyError   = 40

	maxQueuedRecords = 10000
	maxRecordBytes   = 16 << 10
)

type logRecord struct {
	level int
	msg   string
}

var (
	logQueue  *wake.Queue[logRecord] // nil if the pipe could not be made: records are dropped
	minLevel  atomic.Int64           // Python level below which records are not even formatted
	dropped   atomic.Int64
	logReadMu sync.Mutex // serialises dc_log_next
)

func init() {
	minLevel.Store(pyWarning)
	if q, err := wake.New[logRecord](); err == nil {
		logQueue = q
	}
	slog.SetDefault(slog.New(queueHandler{}))
	slog.Debug("dynamo_ctx native library loaded", "version", version)
}

func pyLevel(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return pyError
	case l >= slog.LevelWarn:
		return pyWarning
	case l >= slog.LevelInfo:
		return pyInfo
	}
	return pyDebug
}

type queueHandler struct {
	attrs string // pre-formatted " k=v" pairs from WithAttrs
	group string
}

func (h queueHandler) Enabled(_ context.Context, l slog.Level) bool {
	return int64(pyLevel(l)) >= minLevel.Load() && logQueue != nil
}

func (h queueHandler) Handle(_ context.Context, r slog.Record) error {
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
	if logQueue.Len() >= maxQueuedRecords {
		dropped.Add(1)
		return nil
	}
	if n := dropped.Swap(0); n > 0 {
		_ = logQueue.Push(logRecord{pyWarning, fmt.Sprintf("%d log records dropped: nobody drained the log queue", n)})
	}
	return logQueue.Push(logRecord{pyLevel(r.Level), msg})
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

func (h queueHandler) WithAttrs(as []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(h.attrs)
	for _, a := range as {
		writeAttr(&b, h.group, a)
	}
	return queueHandler{attrs: b.String(), group: h.group}
}

func (h queueHandler) WithGroup(name string) slog.Handler {
	g := name
	if h.group != "" {
		g = h.group + "." + name
	}
	return queueHandler{attrs: h.attrs, group: g}
}
