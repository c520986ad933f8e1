package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// rawFetch opens a fetch of token on s by hand and returns the connection.
func rawFetch(t *testing.T, s *Server, token string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	hdr := make([]byte, frame.HeaderSize, frame.HeaderSize+len(token))
	hdr[0] = byte(frame.Fetch)
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(token)))
	_, err = c.Write(append(hdr, token...))
	require.NoError(t, err)
	return c
}

// TestFetchRequest: an offered request is fetched whole, once; an unknown
// token, or one fetched already, is refused (after a few redials, within
// the connect timeout).
func TestFetchRequest(t *testing.T) {
	s := listen(t)
	tok := NewToken()
	in := s.Expect(tok)
	defer in.Close()
	req := bytes.Repeat([]byte("0123456789"), 300_000) // 3 MB: many writes
	in.Offer(req)
	got, err := FetchRequest(context.Background(), s.Addr().String(), tok, len(req))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(req, got), "the fetched request differs")
	t0 := time.Now()
	_, err = FetchRequest(context.Background(), s.Addr().String(), tok, len(req), WithConnectTimeout(time.Second))
	require.ErrorIs(t, err, ErrFetch, "fetched twice")
	assert.Less(t, time.Since(t0), 2*time.Second)
	_, err = FetchRequest(context.Background(), s.Addr().String(), NewToken(), 10, WithConnectTimeout(time.Second))
	require.ErrorIs(t, err, ErrFetch, "an unknown token")
	_, err = FetchRequest(context.Background(), s.Addr().String(), tok, 0)
	require.ErrorIs(t, err, ErrFetch, "nothing to fetch")
}

// TestFetchCutByKill: a caller's Kill (or Close) cuts a fetch in progress,
// and ends an offer not yet fetched.
func TestFetchCutByKill(t *testing.T) {
	for _, end := range []string{"kill", "close"} {
		t.Run(end, func(t *testing.T) {
			s := listen(t)
			tok := NewToken()
			in := s.Expect(tok)
			req := bytes.Repeat([]byte("x"), 64<<20) // more than the socket buffers hold
			in.Offer(req)
			c := rawFetch(t, s, tok)
			var b [1024]byte
			_, err := io.ReadFull(c, b[:]) // the fetch is under way; the rest waits for us
			require.NoError(t, err)
			if end == "kill" {
				in.Kill()
			} else {
				_ = in.Close()
			}
			_ = c.SetReadDeadline(time.Now().Add(waitFor))
			n, err := io.Copy(io.Discard, c)
			assert.Less(t, n, int64(len(req)), "the whole request came after the kill")
			var ne net.Error
			assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the fetch was not cut: %v", err)
			// A stream killed before its fetch offers nothing.
			tok2 := NewToken()
			in2 := s.Expect(tok2)
			in2.Offer(req)
			in2.Kill()
			_, err = FetchRequest(context.Background(), s.Addr().String(), tok2, len(req), WithConnectTimeout(200*time.Millisecond))
			require.ErrorIs(t, err, ErrFetch)
		})
	}
}

// TestFetchBoundedByWhatArrives: a caller that announces the largest
// request and sends a few bytes costs the worker little (its buffer grows
// as bytes arrive), and a cancelled fetch (the request killed) ends at once.
func TestFetchBoundedByWhatArrives(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var hdr [frame.HeaderSize + 32]byte
		_, _ = io.ReadFull(c, hdr[:])
		_, _ = c.Write([]byte("[1,2,3"))
		_, _ = io.Copy(io.Discard, c) // then silence, until the worker closes
	}()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := FetchRequest(ctx, ln.Addr().String(), NewToken(), 256<<20)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("a fetch announcing 256 MiB that received 6 bytes: heap grew %d KiB", grew>>10)
	assert.Less(t, grew, int64(4<<20))
	t0 := time.Now()
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrFetch)
		assert.ErrorContains(t, err, context.Canceled.Error())
	case <-time.After(waitFor):
		t.Fatal("a cancelled fetch did not end")
	}
	assert.Less(t, time.Since(t0), time.Second)
}
