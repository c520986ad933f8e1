package plane_test

import (
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// The caller's metadata reaches the handler's side as sent; a request
// without metadata has none.
func TestMetadataCarried(t *testing.T) {
	const path = "test.meta.generate"
	host := startEmbedded(t)
	wrt := join(t, host)
	got := make(chan []byte, 2)
	serve(t, wrt, path, func(req *plane.Request) {
		got <- req.Metadata
		send(req, num(0))
	})
	c := newClient(t, host, path)
	waitInstances(t, c, 1)

	meta := []byte(`{"tenant":"alpha","region":"us-west"}`)
	s, err := c.Generate([]byte(`{}`), ctxtree.New("meta-1"), plane.RoundRobin, 0, plane.WithMetadata(meta))
	require.NoError(t, err)
	items, _, err := drain(s, 0)
	require.ErrorIs(t, err, io.EOF)
	requireSeq(t, items, 0, 1)
	assert.JSONEq(t, string(meta), string(recv(t, got, "the handler")))

	s = generate(t, c, `{}`, nil)
	_, _, err = drain(s, 0)
	require.ErrorIs(t, err, io.EOF)
	assert.Nil(t, recv(t, got, "the handler"))
}

// Metadata that is not a JSON object, or is too large, is refused before
// anything is sent, with or without migration.
func TestMetadataRejected(t *testing.T) {
	host := startEmbedded(t)
	c := newClient(t, host, "test.metabad.generate")
	big := `{"k":"` + strings.Repeat("x", plane.MaxMetadataBytes) + `"}`
	for _, limit := range []int{0, 1} {
		c.SetMigrationLimit(limit)
		for _, bad := range []string{`[1]`, `"s"`, `{"a":`, `null`, big} {
			_, err := c.Generate([]byte(`{}`), nil, plane.RoundRobin, 0, plane.WithMetadata([]byte(bad)))
			require.ErrorIs(t, err, plane.ErrBadMetadata, "metadata %.20q, migration limit %d", bad, limit)
		}
	}
}

// Every attempt of a migrating request carries the request's metadata.
func TestMetadataMigration(t *testing.T) {
	const path = "test.metamig.generate"
	host := startEmbedded(t)
	var attempts atomic.Int64
	got := make(chan []byte, 4)
	for range 2 {
		wrt := join(t, host)
		serve(t, wrt, path, func(req *plane.Request) {
			got <- req.Metadata
			if attempts.Add(1) == 1 {
				send(req, num(0))
				go wrt.Close() // this worker crashes mid-stream
				<-req.Ctx.Killed()
				return
			}
			send(req, num(1))
		})
	}
	c := newClient(t, host, path)
	waitInstances(t, c, 2)
	c.SetMigrationLimit(1)

	meta := []byte(`{"tenant":"beta"}`)
	s, err := c.Generate([]byte(`{}`), ctxtree.New("meta-mig"), plane.RoundRobin, 0, plane.WithMetadata(meta))
	require.NoError(t, err)
	items, _, err := drain(s, 0)
	require.ErrorIs(t, err, io.EOF)
	requireSeq(t, items, 0, 2)
	require.EqualValues(t, 2, attempts.Load())
	assert.JSONEq(t, string(meta), string(recv(t, got, "the first attempt")))
	assert.JSONEq(t, string(meta), string(recv(t, got, "the second attempt")))
}

// What a handler raises after the caller stopped the request is not
// surfaced: the stream ends as the stop ends it. A failure while the
// caller's context is live still is (TestHandlerFail).
func TestHandlerFailAfterCallerStop(t *testing.T) {
	for _, early := range []bool{false, true} {
		name := "stop during the stream"
		if early {
			name = "stopped before the call"
		}
		t.Run(name, func(t *testing.T) {
			const path = "test.failstop.generate"
			host := startEmbedded(t)
			wrt := join(t, host)
			final := make(chan ctxState, 1)
			serve(t, wrt, path, func(req *plane.Request) {
				if !req.Ctx.IsStopped() {
					send(req, num(0))
				}
				<-req.Ctx.Stopped()
				req.Fail("CancelledError: ")
				final <- snapshot(req.Ctx)
			})
			c := newClient(t, host, path)
			waitInstances(t, c, 1)

			parent := ctxtree.New("fail-after-stop")
			if early {
				parent.Cancel(ctxtree.Stopped, ctxtree.ReasonStopGenerating)
			}
			s := generate(t, c, `{}`, parent)
			if !early {
				items, err := take(s, 1)
				require.NoError(t, err)
				requireSeq(t, items, 0, 1)
				parent.Cancel(ctxtree.Stopped, ctxtree.ReasonStopGenerating)
			}
			items, _, err := drain(s, 0)
			require.ErrorIs(t, err, io.EOF)
			assert.Empty(t, items)
			st := recv(t, final, "the handler")
			assert.True(t, st.stopped)
			assert.False(t, st.killed)
		})
	}
}
