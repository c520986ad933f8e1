package frontend_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
)

// What the frontend must not take for a client that went away (pipelined
// requests, Expect: 100-continue, HTTP/1.0, kept-alive connections closed
// right after their last response): each request is answered in full and
// no cancellation is counted.

func rawPostReq(path, body string, extra string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
		path, extra, len(body), body)
}

func TestNoFalseDisconnects(t *testing.T) {
	e, _ := one(t)
	addr := strings.TrimPrefix(e.base, "http://")
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(planetest.WaitLimit)))
		t.Cleanup(func() { _ = c.Close() })
		return c, bufio.NewReader(c)
	}
	readResp := func(br *bufio.Reader) string {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		return string(b)
	}
	requests := 0

	t.Run("pipelined", func(t *testing.T) {
		c, br := dial()
		_, err := io.WriteString(c, rawPostReq("/v1/completions", completion("m", "hi", 20, true), "")+
			rawPostReq("/v1/completions", completion("m", "hi", 20, false), "")+
			rawPostReq("/v1/completions", completion("m", "hi", 20, true), ""))
		require.NoError(t, err)
		for i := range 3 {
			b := readResp(br)
			assert.Contains(t, b, "length", "response %d", i)
			requests++
		}
	})
	t.Run("expect 100-continue", func(t *testing.T) {
		c, br := dial()
		body := completion("m", "hi", 20, true)
		_, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body))
		require.NoError(t, err)
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		require.Contains(t, line, "100")
		_, _ = br.ReadString('\n')
		_, err = io.WriteString(c, body)
		require.NoError(t, err)
		assert.Contains(t, readResp(br), "[DONE]")
		requests++
	})
	t.Run("keep-alive then close", func(t *testing.T) {
		for range 20 {
			c, br := dial()
			for range 3 {
				_, err := io.WriteString(c, rawPostReq("/v1/completions", completion("m", "hi", 5, true), ""))
				require.NoError(t, err)
				assert.Contains(t, readResp(br), "[DONE]")
				requests++
			}
			require.NoError(t, c.Close()) // at once: the handler may not have returned yet
		}
	})
	t.Run("HTTP/1.0", func(t *testing.T) {
		c, br := dial()
		body := completion("m", "hi", 5, false)
		_, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		require.NoError(t, err)
		assert.Contains(t, readResp(br), "length")
		requests++
	})
	time.Sleep(200 * time.Millisecond)
	m := e.metrics()
	assert.Equal(t, float64(requests), m[key(mRequests, "m")])
	assert.Zero(t, m[key(mCancellations, "m")])
}
