package status_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 5 * time.Second

var paths = []string{"/metrics", "/health", "/live"}

func start(t *testing.T, opts status.Options) *status.Server {
	t.Helper()
	opts.Addr = "127.0.0.1:0"
	if opts.Paths == nil {
		opts.Paths = paths
	}
	s, err := status.New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// host answers every ask with render's answer, as a host's loop would:
// Next until ErrAgain, then Arm and wait, until the server closes. The
// returned function closes it and waits for the host to end.
func host(t *testing.T, s *status.Server, render func(status.Ask) status.Answer) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			a, err := s.Next()
			switch {
			case errors.Is(err, status.ErrClosed):
				return
			case errors.Is(err, status.ErrAgain):
				woken := make(chan struct{})
				s.Arm(func() { close(woken) })
				<-woken
				continue
			}
			if err := s.Answer(a.ID, render(a)); err != nil && !errors.Is(err, status.ErrNotWaiting) && !errors.Is(err, status.ErrClosed) {
				t.Errorf("Answer: %v", err)
			}
		}
	}()
	return func() {
		_ = s.Close()
		<-done
	}
}

func echo(a status.Ask) status.Answer {
	return status.Answer{Code: 200, ContentType: "text/plain; version=0.0.4", Body: []byte("path " + a.Path + "\n")}
}

func get(t *testing.T, method, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	c := &http.Client{Timeout: wait}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

func TestTheHostAnswers(t *testing.T) {
	s := start(t, status.Options{})
	defer host(t, s, echo)()
	base := "http://" + s.Addr()
	resp, body := get(t, "GET", base+"/metrics?x=1")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "path /metrics\n", body)
	assert.Equal(t, "text/plain; version=0.0.4", resp.Header.Get("Content-Type"))
	assert.True(t, resp.Close, "each connection closes after its answer")
	resp, body = get(t, "HEAD", base+"/health")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Empty(t, body)
	assert.EqualValues(t, len("path /health\n"), resp.ContentLength)
	resp, body = get(t, "POST", base+"/metrics")
	assert.Equal(t, 405, resp.StatusCode)
	assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	assert.Equal(t, "method not allowed\n", body)
	resp, body = get(t, "GET", base+"/nope")
	assert.Equal(t, 404, resp.StatusCode)
	assert.Equal(t, "not found\n", body)
}

// A host that does not answer in time: 503, and the ask is gone (its late
// answer is refused, Next no longer gives it).
func TestNoAnswerInTimeIs503(t *testing.T) {
	s := start(t, status.Options{AnswerTimeout: 100 * time.Millisecond})
	begin := time.Now()
	resp, body := get(t, "GET", "http://"+s.Addr()+"/metrics")
	assert.Equal(t, 503, resp.StatusCode)
	assert.Contains(t, body, "no answer within 100ms")
	assert.Less(t, time.Since(begin), wait/2)
	_, err := s.Next()
	assert.ErrorIs(t, err, status.ErrAgain)
	assert.ErrorIs(t, s.Answer(1, echo(status.Ask{})), status.ErrNotWaiting)
}

// Past MaxConnections asks waiting for the host, one more is 503 at once.
func TestWaitingAsksAreBounded(t *testing.T) {
	s := start(t, status.Options{MaxConnections: 2, AnswerTimeout: wait})
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := get(t, "GET", "http://"+s.Addr()+"/live")
			assert.Equal(t, 200, resp.StatusCode)
		}()
	}
	var asks []status.Ask
	require.Eventually(t, func() bool {
		if a, err := s.Next(); err == nil {
			asks = append(asks, a)
		}
		return len(asks) == 2
	}, wait, time.Millisecond)
	resp, body := get(t, "GET", "http://"+s.Addr()+"/live")
	assert.Equal(t, 503, resp.StatusCode)
	assert.Contains(t, body, "2 requests already wait")
	for _, a := range asks {
		require.NoError(t, s.Answer(a.ID, echo(a)))
	}
	wg.Wait()
}

// Silent connections past the bound close the oldest of them at once: a
// probe is answered at once, the oldest are closed, the newest held.
func TestSilentConnectionsMakeRoomForProbes(t *testing.T) {
	const bound, extra = 8, 20
	s := start(t, status.Options{MaxConnections: bound, ReadTimeout: 30 * time.Second})
	defer host(t, s, echo)()
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			_ = c.Close()
		}
	}()
	for i := 0; i < bound+extra; i++ {
		c, err := net.Dial("tcp", s.Addr())
		require.NoError(t, err)
		if i%2 == 1 {
			_, err = io.WriteString(c, "GET /live HTTP/1.1\r\n") // never finished
			require.NoError(t, err)
		}
		silent = append(silent, c)
		time.Sleep(5 * time.Millisecond) // accepted in order
	}
	for i := 0; i < 5; i++ {
		begin := time.Now()
		resp, _ := get(t, "GET", "http://"+s.Addr()+"/live")
		assert.Equal(t, 200, resp.StatusCode)
		assert.Less(t, time.Since(begin), time.Second)
	}
	closed := func(c net.Conn) bool {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
	for i, c := range silent {
		assert.Equal(t, i <= extra, closed(c), "connection %d", i)
	}
}

// A head past MaxHeaderBytes is refused; a head not sent within the read
// timeout closes the connection.
func TestHeadBounds(t *testing.T) {
	s := start(t, status.Options{ReadTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 2*status.MaxHeaderBytes)+"\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)

	slow, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer slow.Close()
	_, err = io.WriteString(slow, "GET /metrics HTTP/1.1\r\n")
	require.NoError(t, err)
	begin := time.Now()
	require.NoError(t, slow.SetReadDeadline(time.Now().Add(wait)))
	_, _ = io.ReadAll(slow)
	assert.Less(t, time.Since(begin), wait/2, "closed by the read timeout")
}

// Close wakes an armed host, ends the requests waiting for an answer, and
// Next and Answer say it is closed.
func TestCloseWakesTheHost(t *testing.T) {
	s := start(t, status.Options{AnswerTimeout: wait})
	woken := make(chan struct{})
	s.Arm(func() { close(woken) })
	got := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Timeout: wait}).Get("http://" + s.Addr() + "/health")
		if err == nil {
			_ = resp.Body.Close()
		}
		got <- err
	}()
	<-woken // the ask woke it
	a, err := s.Next()
	require.NoError(t, err)
	assert.Equal(t, "/health", a.Path)
	again := make(chan struct{})
	s.Arm(func() { close(again) })
	require.NoError(t, s.Close())
	<-again
	<-got // answered 503, or the connection closed: not left waiting
	_, err = s.Next()
	assert.ErrorIs(t, err, status.ErrClosed)
	assert.ErrorIs(t, s.Answer(a.ID, echo(a)), status.ErrClosed)
	require.NoError(t, s.Close(), "idempotent")
}

func TestBadOptionsAndAnswers(t *testing.T) {
	for _, o := range []status.Options{
		{}, {Paths: []string{"metrics"}}, {Paths: []string{"/" + strings.Repeat("a", status.MaxPathLen)}},
		{Paths: []string{"/a b"}}, {Paths: []string{"/a?b"}}, {Paths: paths, MaxConnections: -1},
		{Paths: paths, AnswerTimeout: -time.Second},
	} {
		_, err := status.New(o)
		assert.ErrorIs(t, err, status.ErrBadOptions, "%+v", o)
	}
	_, err := status.New(status.Options{Addr: "127.0.0.1:-1", Paths: paths})
	require.Error(t, err)
	assert.NotErrorIs(t, err, status.ErrBadOptions)

	s := start(t, status.Options{})
	for _, a := range []status.Answer{
		{Code: 99}, {Code: 600}, {Code: 200, ContentType: "text/plain\r\nX: y"},
		{Code: 200, ContentType: strings.Repeat("a", status.MaxContentTypeLen+1)},
		{Code: 200, Body: make([]byte, status.MaxBodyBytes+1)},
	} {
		assert.ErrorIs(t, s.Answer(1, a), status.ErrBadAnswer)
	}
	assert.ErrorIs(t, s.Answer(1, status.Answer{Code: 200}), status.ErrNotWaiting)
}

// FileListener serves a copy of a host's listening socket; anything else
// is refused.
func TestFileListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f, err := ln.(*net.TCPListener).File()
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	fl, err := status.FileListener(int(f.Fd()))
	require.NoError(t, err)
	require.NoError(t, f.Close(), "the host may close its own at once")
	s, err := status.New(status.Options{Listener: fl, Paths: paths})
	require.NoError(t, err)
	defer host(t, s, echo)()
	resp, body := get(t, "GET", "http://"+s.Addr()+"/health")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "path /health\n", body)

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	_, err = status.FileListener(int(r.Fd()))
	assert.ErrorIs(t, err, status.ErrBadOptions)
	_, err = status.FileListener(-1)
	assert.ErrorIs(t, err, status.ErrBadOptions)
}
