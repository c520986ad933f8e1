package frontend_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
)

// A client that half-closes its connection (shutdown(SHUT_WR)) while its
// request is generating is taken for gone, as net/http takes it (it cancels
// the request's context): the request is killed. The client still reads,
// though, so what it gets must not claim a generation that did not happen:
// no finish_reason and no [DONE] made up from the killed stream's end.
//
// A killed stream ends as cleanly (io.EOF) as a finished one, so the
// response loop must know the client is gone before the kill lands: when
// net/http cancels r.Context(), the disconnect handler (a context.AfterFunc)
// may run and kill before the cancel reaches the loop's own context, and a
// select may take a pump's end event over ctx.Done().
func TestHalfClosedClientGetsNoMadeUpEnd(t *testing.T) {
	e, got := holding(t, 2)
	addr := strings.TrimPrefix(e.base, "http://")

	const rounds = 20
	for _, tc := range []struct {
		stream bool
		n      int
	}{{true, 1}, {false, 1}, {true, 2}, {false, 2}} {
		stream, n := tc.stream, tc.n
		t.Run(fmt.Sprintf("stream=%v,n=%d", stream, n), func(t *testing.T) {
			madeUp := 0
			for i := range rounds {
				body := fmt.Sprintf(`{"model":"m","prompt":"hi","max_tokens":50,"stream":%v,"n":%d}`, stream, n)
				c, err := net.Dial("tcp", addr)
				require.NoError(t, err)
				_, err = fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
					"x-request-id: half-%v-%d-%d\r\nContent-Length: %d\r\n\r\n%s", stream, n, i, len(body), body)
				require.NoError(t, err)
				for range n {
					planetest.Recv(t, got, "the request at the worker")
				}
				require.NoError(t, c.(*net.TCPConn).CloseWrite()) // still reading
				require.NoError(t, c.SetReadDeadline(time.Now().Add(planetest.WaitLimit)))
				resp, err := io.ReadAll(c)
				_ = c.Close()
				require.NoError(t, err)
				r := string(resp)
				if strings.Contains(r, "[DONE]") || strings.Contains(r, `"finish_reason":"stop"`) {
					madeUp++
					if madeUp == 1 {
						t.Logf("round %d, the half-closed client read:\n%s", i, r)
					}
				}
			}
			assert.Zero(t, madeUp, "%d of %d killed requests answered as finished", madeUp, rounds)
		})
	}
}
