package discovery

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Idle, a watcher receives no announcement: the leases' heartbeats go to
// the discovery stream, and the watcher only its consumer's heartbeat.
func TestStreamIdleWatcherReceivesNoHeartbeats(t *testing.T) {
	nc, url := server(t)
	wc := client(t, url)
	w := watch(t, wc)
	const leases = 10
	for i := range leases {
		register(t, client(t, url), uint64(100+i), "m", WithHeartbeat(100*time.Millisecond))
	}
	require.Eventually(t, func() bool { return len(w.Instances()) == leases }, 5*time.Second, time.Millisecond)
	before := wc.Stats().InMsgs
	time.Sleep(2 * time.Second) // 20 heartbeats of each lease
	got := wc.Stats().InMsgs - before
	t.Logf("watcher received %d messages in 2 s of %d leases beating every 100 ms", got, leases)
	// By heartbeat it would be 200; the consumer's own heartbeat is 1/s.
	assert.LessOrEqual(t, got, uint64(6))
	assert.Len(t, w.Instances(), leases)
	_ = nc
}

// A lease whose process dies is expired by the stream's schedule: its
// watchers receive "expired" once, within the lease's TTL (+-0.5 s of the
// scheduler's rounding); a live lease stays through many TTLs.
func TestStreamCrashedLeaseExpires(t *testing.T) {
	nc, url := server(t)
	w := watch(t, nc)
	dying := client(t, url)
	opts := []RegisterOption{WithHeartbeat(200 * time.Millisecond), WithLeaseTTL(time.Second)}
	register(t, dying, 11, "", opts...)
	register(t, client(t, url), 12, "", opts...)
	require.Eventually(t, func() bool { return len(w.Instances()) == 2 }, 5*time.Second, time.Millisecond)
	time.Sleep(3 * time.Second)
	require.Equal(t, []uint64{11, 12}, ids(w.Instances()))

	dying.Close() // no "down"
	elapsed := waitGone(t, w, 11, 10*time.Second)
	t.Logf("crashed lease gone after %s (TTL 1 s)", elapsed)
	assert.Equal(t, []uint64{12}, ids(w.Instances()))
	// A watcher started afterwards does not see it either.
	assert.Equal(t, []uint64{12}, ids(watch(t, nc).Instances()))
}

// A watcher that loses its consumer (a node died, it fell behind) reads
// the stream afresh: a live instance is never dropped, one that left
// meanwhile is, one that came meanwhile appears.
func TestStreamWatcherResyncs(t *testing.T) {
	nc, url := server(t)
	w := watch(t, nc)
	reg := client(t, url)
	register(t, reg, 1, "a")
	gone := register(t, reg, 2, "b")
	require.Eventually(t, func() bool { return len(w.Instances()) == 2 }, 5*time.Second, time.Millisecond)

	var dropped atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ch := w.Changes()
			if !contains(w.Instances(), 1) {
				dropped.Store(true)
			}
			select {
			case <-ch:
			case <-time.After(20 * time.Second):
				return
			}
			if contains(w.Instances(), 3) && !contains(w.Instances(), 2) {
				return
			}
		}
	}()

	// The consumer disappears under the watcher, and meanwhile one
	// instance leaves and another comes.
	js, err := jetstream.New(reg)
	require.NoError(t, err)
	s, err := js.Stream(context.Background(), streamName)
	require.NoError(t, err)
	for name := range s.ConsumerNames(context.Background()).Name() {
		require.NoError(t, s.DeleteConsumer(context.Background(), name))
	}
	gone.Close()
	register(t, reg, 3, "c")
	<-done
	assert.Equal(t, []uint64{1, 3}, ids(w.Instances()))
	assert.False(t, dropped.Load(), "a live instance was dropped")
}

// A "down" forged on the stream is ignored by watchers, and the lease puts
// its "up" back over it at its next heartbeat.
func TestStreamForgedDownIgnored(t *testing.T) {
	nc, url := server(t)
	w := watch(t, nc)
	register(t, client(t, url), 7, "m", WithHeartbeat(100*time.Millisecond))
	require.Eventually(t, func() bool { return len(w.Instances()) == 1 }, 5*time.Second, time.Millisecond)

	js, err := jetstream.New(client(t, url))
	require.NoError(t, err)
	msg, err := js.Stream(context.Background(), streamName)
	require.NoError(t, err)
	last, err := msg.GetLastMsgForSubject(context.Background(), stateSubject(path, 7))
	require.NoError(t, err)
	var seen announcement
	require.NoError(t, json.Unmarshal(last.Data, &seen))
	fake, err := json.Marshal(announcement{Op: opDown, ID: 7, Lease: seen.Lease, Secret: seen.Proof})
	require.NoError(t, err)
	_, err = js.Publish(context.Background(), stateSubject(path, 7), fake)
	require.NoError(t, err)

	// The lease restores its state; a watcher started then finds it.
	require.Eventually(t, func() bool {
		m, err := msg.GetLastMsgForSubject(context.Background(), stateSubject(path, 7))
		return err == nil && m.Sequence > last.Sequence+1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, []uint64{7}, ids(w.Instances()))
	assert.Equal(t, []uint64{7}, ids(watch(t, nc).Instances()))
}

// jsServer starts a JetStream server on port (0: any), for a restart on
// the same address.
func jsServer(t *testing.T, port int) *natsserver.Server {
	t.Helper()
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port = l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
	}
	srv, err := natsserver.NewServer(&natsserver.Options{
		Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
	})
	require.NoError(t, err)
	srv.Start()
	require.True(t, srv.ReadyForConnections(5*time.Second))
	return srv
}

// The server is replaced by one that knows nothing (as after an embedded
// server's takeover): the lease puts its state again, the watcher reads
// the new stream, and the instance is never dropped.
func TestStreamServerReplaced(t *testing.T) {
	srv := jsServer(t, 0)
	port := srv.Addr().(*net.TCPAddr).Port
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	connect := func() *nats.Conn {
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	wc, lc := connect(), connect()
	w := watch(t, wc)
	l := register(t, lc, 5, "five", WithHeartbeat(100*time.Millisecond))
	require.Eventually(t, func() bool { return len(w.Instances()) == 1 }, 5*time.Second, time.Millisecond)

	srv.Shutdown()
	srv.WaitForShutdown()
	srv = jsServer(t, port)
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	require.Eventually(t, func() bool { return wc.IsConnected() && lc.IsConnected() }, 5*time.Second, 10*time.Millisecond)
	l.Announce()
	w.Resync()

	// A new watcher finds it in the new stream; the old one kept it.
	require.Eventually(t, func() bool {
		nw, err := Watch(context.Background(), connect(), path, WithLogger(quiet))
		if err != nil {
			return false
		}
		defer nw.Close()
		return len(nw.Instances()) == 1
	}, 5*time.Second, 50*time.Millisecond)
	time.Sleep(4 * time.Second) // past the grace of an instance missing from a read
	assert.Equal(t, []uint64{5}, ids(w.Instances()))
}
