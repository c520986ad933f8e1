package natsbus

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return strconv.Itoa(port)
}

func connect(t *testing.T, opts Options) *Bus {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := Connect(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return b
}

// roundTrip checks that a message published by one bus reaches the other,
// which proves they share a server.
func roundTrip(t *testing.T, from, to *Bus) {
	t.Helper()
	subj := nats.NewInbox()
	sub, err := to.Conn().SubscribeSync(subj)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, to.Conn().Flush())
	require.NoError(t, from.Conn().Publish(subj, []byte("ping")))
	msg, err := sub.NextMsg(2 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(msg.Data))
}

// closeAndWaitTakeover closes host and waits until a and b are connected
// again, both to one server that is not host's.
func closeAndWaitTakeover(t *testing.T, host, a, b *Bus) {
	t.Helper()
	old := host.Conn().ConnectedServerId()
	host.Close()
	require.Eventually(t, func() bool {
		ida, idb := a.Conn().ConnectedServerId(), b.Conn().ConnectedServerId()
		return a.Conn().IsConnected() && b.Conn().IsConnected() && ida == idb && ida != old
	}, 5*time.Second, 5*time.Millisecond)
}

// portHolder occupies a free port with something that is not a NATS server
// and returns its address: each connection it accepts is closed at once or,
// when silent, held open without a word. All is released at the end of the
// test.
func portHolder(t *testing.T, silent bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if !silent {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

func TestEphemeralEmbeddedAndClients(t *testing.T) {
	host := connect(t, Options{URL: "nats://127.0.0.1:0"})
	assert.True(t, host.Embedded())
	_, port, ok := splitAddr(host.URL())
	require.True(t, ok)
	assert.NotEqual(t, "0", port)
	assert.NotEqual(t, "4222", port)

	client := connect(t, Options{URL: host.URL()})
	assert.False(t, client.Embedded())
	assert.Equal(t, host.Conn().ConnectedServerId(), client.Conn().ConnectedServerId())
	roundTrip(t, client, host)
	roundTrip(t, host, client)
}

func TestEnvURL(t *testing.T) {
	host := connect(t, Options{URL: "nats://127.0.0.1:0"})
	t.Setenv(EnvURL, host.URL())
	client := connect(t, Options{})
	assert.False(t, client.Embedded())
	assert.Equal(t, host.URL(), client.URL())
	roundTrip(t, host, client)
}

func TestExplicitURLNothingListeningFailsFast(t *testing.T) {
	url := "nats://127.0.0.1:" + freePort(t)
	start := time.Now()
	b, err := Connect(context.Background(), Options{URL: url, Logger: quiet})
	elapsed := time.Since(start)
	require.Error(t, err)
	assert.Nil(t, b)
	assert.Contains(t, err.Error(), url)
	assert.Less(t, elapsed, time.Second)
	t.Logf("failed after %s", elapsed)
}

func TestEmbedIfAbsentOnFixedPort(t *testing.T) {
	url := "nats://127.0.0.1:" + freePort(t)
	b := connect(t, Options{URL: url, EmbedIfAbsent: true})
	assert.True(t, b.Embedded())
	assert.Equal(t, url, b.URL())
	other := connect(t, Options{URL: url, EmbedIfAbsent: true})
	assert.False(t, other.Embedded())
	roundTrip(t, b, other)
}

// Several processes starting at once on an empty address end up on one
// server, hosted by exactly one of them.
func TestRacingEmbeddersShareOneServer(t *testing.T) {
	for round := range 5 {
		url := "nats://127.0.0.1:" + freePort(t)
		const n = 4
		buses := make([]*Bus, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				buses[i], errs[i] = Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
			})
		}
		close(start)
		wg.Wait()
		embedded := 0
		for i := range n {
			require.NoError(t, errs[i], "round %d bus %d", round, i)
			if buses[i].Embedded() {
				embedded++
			}
		}
		assert.Equal(t, 1, embedded, "round %d: exactly one process hosts the server", round)
		for i := 1; i < n; i++ {
			assert.Equal(t, buses[0].Conn().ConnectedServerId(), buses[i].Conn().ConnectedServerId())
		}
		roundTrip(t, buses[1], buses[2])
		// Close clients before the host so that no takeover happens.
		for _, b := range buses {
			if !b.Embedded() {
				b.Close()
			}
		}
		for _, b := range buses {
			b.Close()
		}
	}
}

func TestTakeoverWhenHostExits(t *testing.T) {
	url := "nats://127.0.0.1:" + freePort(t)
	host, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
	require.NoError(t, err)
	require.True(t, host.Embedded())
	a := connect(t, Options{URL: url, EmbedIfAbsent: true})
	b := connect(t, Options{URL: url, EmbedIfAbsent: true})

	old := host.Conn().ConnectedServerId()
	start := time.Now()
	host.Close()
	// The survivors may not have noticed the shutdown yet when Close
	// returns: wait until both are on a server that is not the old one.
	require.Eventually(t, func() bool {
		ida, idb := a.Conn().ConnectedServerId(), b.Conn().ConnectedServerId()
		return a.Conn().IsConnected() && b.Conn().IsConnected() && ida == idb && ida != old
	}, 5*time.Second, 5*time.Millisecond)
	t.Logf("survivors reconnected to a replacement server after %s", time.Since(start))
	assert.NotEqual(t, a.Embedded(), b.Embedded(), "exactly one survivor hosts the replacement")
	roundTrip(t, a, b)

	late := connect(t, Options{URL: url})
	assert.False(t, late.Embedded())
	assert.Equal(t, a.Conn().ConnectedServerId(), late.Conn().ConnectedServerId())
}

// Session ends when the connection goes down (a request awaiting its reply
// then stops waiting) and a fresh, live one follows.
func TestSessionEndsOnDisconnect(t *testing.T) {
	url := "nats://127.0.0.1:" + freePort(t)
	host, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
	require.NoError(t, err)
	a := connect(t, Options{URL: url, EmbedIfAbsent: true})
	s := a.Session()
	require.NoError(t, s.Err())
	host.Close()
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session outlived the connection")
	}
	require.Eventually(t, func() bool { return a.Conn().IsConnected() }, 5*time.Second, 5*time.Millisecond)
	assert.NoError(t, a.Session().Err())
}

// A standalone nats-server on the address is never replaced: when it
// restarts it must find its port free.
func TestNoTakeoverOfStandaloneServer(t *testing.T) {
	port := freePort(t)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	standalone := func() *server.Server {
		srv, err := server.NewServer(&server.Options{ServerName: "standalone", Host: "127.0.0.1", Port: p, NoLog: true, NoSigs: true})
		require.NoError(t, err)
		srv.Start()
		require.True(t, srv.ReadyForConnections(5*time.Second))
		return srv
	}
	srv := standalone()
	b := connect(t, Options{URL: "nats://127.0.0.1:" + port, EmbedIfAbsent: true})
	require.False(t, b.Embedded())

	srv.Shutdown()
	srv.WaitForShutdown()
	require.Eventually(t, func() bool { return !b.Conn().IsConnected() }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(5 * reconnectWait) // several reconnect failures, each a takeover chance
	assert.False(t, b.Embedded())

	srv = standalone() // the port is free
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	require.Eventually(t, b.Conn().IsConnected, 5*time.Second, 5*time.Millisecond)
	b.Close() // before the server, so the Bus never sees it vanish again
}

// A port held by something that is not a NATS server fails Connect with an
// error that says so. A holder that accepts and never speaks costs one
// connect timeout, not five, and the error says what to do.
func TestPortHeldByNonNATSFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		silent bool
		want   string
		within time.Duration
	}{
		{"closes at once", false, "does not answer as a NATS server", 3 * time.Second},
		{"silent", true, "set NATS_SERVER to another address", connectTimeout + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := portHolder(t, tc.silent)
			start := time.Now()
			_, err := Connect(context.Background(), Options{URL: "nats://" + addr, EmbedIfAbsent: true, Logger: quiet})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Less(t, time.Since(start), tc.within)
		})
	}
}

func TestConnectContextCancelled(t *testing.T) {
	addr := portHolder(t, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Connect(ctx, Options{URL: "nats://" + addr, EmbedIfAbsent: true, Logger: quiet})
	require.ErrorIs(t, err, context.Canceled)
}

func TestCloseIdempotent(t *testing.T) {
	b := connect(t, Options{URL: "nats://127.0.0.1:0"})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(b.Close)
	}
	wg.Wait()
	b.Close()
	assert.False(t, b.Embedded())
	assert.True(t, b.Conn().IsClosed())
}

func TestSplitAddr(t *testing.T) {
	for _, tc := range []struct {
		in, host, port string
		ok             bool
	}{
		{"nats://127.0.0.1:4222", "127.0.0.1", "4222", true},
		{"127.0.0.1:5000", "127.0.0.1", "5000", true},
		{"nats://localhost", "localhost", "4222", true},
		{"nats://user:pw@10.0.0.1:4333", "10.0.0.1", "4333", true},
		{"nats://a:4222,nats://b:4222", "", "", false},
		{"tls://h:4222", "", "", false},
	} {
		h, p, ok := splitAddr(tc.in)
		assert.Equal(t, tc.ok, ok, tc.in)
		assert.Equal(t, tc.host, h, tc.in)
		assert.Equal(t, tc.port, p, tc.in)
	}
	h, p, _ := splitAddr(DefaultURL)
	assert.True(t, isDefault(h, p))
	assert.False(t, isDefault("127.0.0.1", "4223"))
	assert.Equal(t, "nats://u:xxxxx@h:1", redact("nats://u:secret@h:1"))
}

// Clients that were simply given an embedded server's address (not told they
// may embed) take it over too when its host exits: that is how the processes
// of a test or demo on its own port survive the death of the one hosting
// NATS. Settling and the reconnect hooks tell the callers about it.
func TestTakeoverOfEphemeralHostByPlainClients(t *testing.T) {
	host, err := Connect(context.Background(), Options{URL: "nats://127.0.0.1:0", Logger: quiet})
	require.NoError(t, err)
	require.True(t, host.Embedded())
	a := connect(t, Options{URL: host.URL()})
	b := connect(t, Options{URL: host.URL()})
	assert.False(t, a.Settling())
	var hooks atomic.Int32
	a.OnReconnect(func() { hooks.Add(1) })

	closeAndWaitTakeover(t, host, a, b)
	assert.NotEqual(t, a.Embedded(), b.Embedded(), "exactly one survivor hosts the replacement")
	assert.True(t, a.Settling(), "within the settle window after a reconnection")
	require.Eventually(t, func() bool { return hooks.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, a.WaitConnected(ctx))
	roundTrip(t, a, b)
}

func TestEnvEmbed(t *testing.T) {
	url := "nats://127.0.0.1:" + freePort(t)
	t.Setenv(EnvURL, url)
	t.Setenv(EnvEmbed, "1")
	b := connect(t, Options{})
	assert.True(t, b.Embedded())
	assert.Equal(t, url, b.URL())
}
