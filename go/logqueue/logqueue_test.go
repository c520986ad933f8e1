//go:build linux

package logqueue

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newQueue(t *testing.T) *Queue {
	t.Helper()
	l, err := New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.q.Close() })
	return l
}

func takeAll(l *Queue) []Record {
	var out []Record
	for l.Next(func(r Record) bool { out = append(out, r); return true }) {
	}
	return out
}

func TestHandlerFormatsAndFilters(t *testing.T) {
	l := newQueue(t)
	lg := slog.New(l.Handler()).With("req", "r1").WithGroup("g")
	lg.Info("not queued at the default level")
	l.SetLevel(Info)
	lg.Debug("not queued")
	lg.Info("hello", "n", 3)
	recs := takeAll(l)
	require.Len(t, recs, 1)
	assert.Equal(t, Info, recs[0].Level)
	assert.Equal(t, `hello req="r1" g.n="3"`, recs[0].Msg)
}

func TestNextLeavesARecordNotTaken(t *testing.T) {
	l := newQueue(t)
	slog.New(l.Handler()).Error("first")
	assert.True(t, l.Next(func(Record) bool { return false }))
	recs := takeAll(l)
	require.Len(t, recs, 1)
	assert.Equal(t, "first", recs[0].Msg)
	assert.False(t, l.Next(func(Record) bool { return true }))
}

func TestBoundedWithDropCount(t *testing.T) {
	l := newQueue(t)
	lg := slog.New(l.Handler())
	for range maxQueuedRecords + 5 {
		lg.Warn("x")
	}
	assert.Len(t, takeAll(l), maxQueuedRecords)
	lg.Warn(strings.Repeat("y", maxRecordBytes+1))
	recs := takeAll(l)
	require.Len(t, recs, 2)
	assert.Equal(t, "5 log records dropped: nobody drained the log queue", recs[0].Msg)
	assert.True(t, strings.HasSuffix(recs[1].Msg, "...(truncated)"))
}

func TestNilQueueDropsEverything(t *testing.T) {
	var l *Queue
	slog.New(l.Handler()).Error("dropped")
	assert.False(t, l.Next(func(Record) bool { return true }))
}
