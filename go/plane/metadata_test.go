package plane_test

import (
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// The caller's metadata reaches the handler's side as sent; a request
// without metadata has none.
func TestMetadataCarried(t *testing.T) {
	const path = "test.meta.generate"
	got := make(chan []byte, 2)
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		got <- req.Metadata
		w.Send(req, num(0))
	})

	meta := []byte(`{"tenant":"alpha","region":"us-west"}`)
	s, err := c.Generate([]byte(`{}`), ctxtree.New("meta-1"), plane.RoundRobin, 0, plane.WithMetadata(meta))
	require.NoError(t, err)
	items, _, err := planetest.Drain(s, 0)
	require.ErrorIs(t, err, io.EOF)
	requireSeq(t, items, 0, 1)
	assert.JSONEq(t, string(meta), string(planetest.Recv(t, got, "the handler")))

	s = planetest.Generate(t, c, `{}`, nil)
	_, _, err = planetest.Drain(s, 0)
	require.ErrorIs(t, err, io.EOF)
	assert.Nil(t, planetest.Recv(t, got, "the handler"))
}

// Metadata that is not a JSON object, or is too large, is refused before
// anything is sent, with or without migration.
func TestMetadataRejected(t *testing.T) {
	host := planetest.Embedded(t)
	c := planetest.Client(t, host, "test.metabad.generate")
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
	host := planetest.Embedded(t)
	var attempts atomic.Int64
	got := make(chan []byte, 4)
	delivered := make(chan struct{}) // the caller has item 0
	for range 2 {
		wrt := planetest.Join(t, host)
		planetest.Serve(t, wrt, path, func(w *planetest.Worker, req *plane.Request) {
			got <- req.Metadata
			if attempts.Add(1) == 1 {
				w.Send(req, num(0))
				// This worker crashes mid-stream, once its item is out (a
				// crash may lose items not yet written: not this test's case).
				select {
				case <-delivered:
				case <-req.Ctx.Killed(): // the test failed before: end
					return
				}
				go wrt.Close()
				<-req.Ctx.Killed()
				return
			}
			w.Send(req, num(1))
		})
	}
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 2)
	c.SetMigrationLimit(1)

	meta := []byte(`{"tenant":"beta"}`)
	s, err := c.Generate([]byte(`{}`), ctxtree.New("meta-mig"), plane.RoundRobin, 0, plane.WithMetadata(meta))
	require.NoError(t, err)
	takeSeq(t, s, 1)
	close(delivered)
	items, _, err := planetest.Drain(s, 0)
	require.ErrorIs(t, err, io.EOF)
	requireSeq(t, items, 1, 1)
	require.EqualValues(t, 2, attempts.Load())
	assert.JSONEq(t, string(meta), string(planetest.Recv(t, got, "the first attempt")))
	assert.JSONEq(t, string(meta), string(planetest.Recv(t, got, "the second attempt")))
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
			final := make(chan ctxState, 1)
			_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
				if !req.Ctx.IsStopped() {
					w.Send(req, num(0))
				}
				<-req.Ctx.Stopped()
				req.Fail("CancelledError: ")
				final <- snapshot(req.Ctx)
			})

			parent := ctxtree.New("fail-after-stop")
			if early {
				parent.Cancel(ctxtree.Stopped, ctxtree.ReasonStopGenerating)
			}
			s := planetest.Generate(t, c, `{}`, parent)
			if !early {
				takeSeq(t, s, 1)
				parent.Cancel(ctxtree.Stopped, ctxtree.ReasonStopGenerating)
			}
			items, _, err := planetest.Drain(s, 0)
			require.ErrorIs(t, err, io.EOF)
			assert.Empty(t, items)
			st := planetest.Recv(t, final, "the handler")
			assert.True(t, st.stopped)
			assert.False(t, st.killed)
		})
	}
}
