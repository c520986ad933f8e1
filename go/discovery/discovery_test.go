package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/natsbus"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const path = "demo.backend.generate"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// server starts an embedded NATS server on an ephemeral port and returns a
// connection to it hosted by the same Bus, plus the URL for more clients.
func server(t *testing.T) (*nats.Conn, string) {
	t.Helper()
	b, err := natsbus.Connect(context.Background(), natsbus.Options{URL: "nats://127.0.0.1:0", Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return b.Conn(), b.URL()
}

// legacyServer starts a NATS server without JetStream, where discovery
// announces by heartbeat to every watcher, and returns a connection to it
// and its URL.
func legacyServer(t *testing.T) (*nats.Conn, string) {
	t.Helper()
	srv, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	srv.Start()
	require.True(t, srv.ReadyForConnections(5*time.Second))
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := srv.ClientURL()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc, url
}

// client opens a separate connection, standing for another process.
func client(t *testing.T, url string) *nats.Conn {
	t.Helper()
	opts, err := natsbus.ClientAuth(url)
	require.NoError(t, err)
	nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(0))...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func watch(t *testing.T, nc *nats.Conn, opts ...WatchOption) *Watcher {
	t.Helper()
	w, err := Watch(context.Background(), nc, path, append([]WatchOption{WithLogger(quiet)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	return w
}

func register(t *testing.T, nc *nats.Conn, id uint64, meta string, opts ...RegisterOption) *Lease {
	t.Helper()
	l, err := Register(nc, path, id, []byte(meta), opts...)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	return l
}

func ids(inst []Instance) []uint64 {
	out := make([]uint64, len(inst))
	for i, in := range inst {
		out[i] = in.ID
	}
	return out
}

// waitGone polls until id is absent and returns how long that took.
func waitGone(t *testing.T, w *Watcher, id uint64, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		ch := w.Changes()
		if !contains(w.Instances(), id) {
			return time.Since(start)
		}
		select {
		case <-ch:
		case <-time.After(time.Millisecond):
		}
	}
	require.Failf(t, "instance still present", "id %x after %s", id, limit)
	return 0
}

func contains(inst []Instance, id uint64) bool {
	for _, in := range inst {
		if in.ID == id {
			return true
		}
	}
	return false
}

func TestWatcherSeesNewRegistrationWithinOneSecond(t *testing.T) {
	nc, url := server(t)
	w := watch(t, nc)
	assert.Empty(t, w.Instances())

	start := time.Now()
	register(t, client(t, url), 42, "meta-42")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	inst, err := w.WaitForInstances(ctx)
	require.NoError(t, err)
	t.Logf("seen after %s", time.Since(start))
	assert.Equal(t, []Instance{{ID: 42, Meta: []byte("meta-42")}}, inst)
}

func TestWatcherStartedLaterSeesInstancesAtOnce(t *testing.T) {
	nc, url := server(t)
	reg := client(t, url)
	// Heartbeats far apart: only the query can explain seeing them.
	register(t, reg, 7, "b", WithHeartbeat(time.Hour))
	register(t, reg, 3, "a", WithHeartbeat(time.Hour))
	register(t, client(t, url), 5, "c", WithHeartbeat(time.Hour))

	// A long window: only the grace after the first reply can end it soon.
	start := time.Now()
	w := watch(t, nc, WithQueryWindow(10*time.Second))
	elapsed := time.Since(start)
	t.Logf("Watch returned with %d instances after %s", len(w.Instances()), elapsed)
	assert.Equal(t, []Instance{{3, []byte("a")}, {5, []byte("c")}, {7, []byte("b")}}, w.Instances())
	assert.Less(t, elapsed, time.Second, "the grace after the first reply cuts the window short")
}

func TestWatchWithNoInstancesReturnsImmediately(t *testing.T) {
	nc, _ := server(t)
	start := time.Now()
	w := watch(t, nc, WithQueryWindow(10*time.Second))
	elapsed := time.Since(start)
	t.Logf("Watch with no instances returned after %s", elapsed)
	assert.Empty(t, w.Instances())
	assert.Less(t, elapsed, time.Second, "the server's no-responders status ends the query")
}

func TestLeaseCloseRemovesAtOnce(t *testing.T) {
	nc, url := server(t)
	w := watch(t, nc, WithTTL(time.Hour))
	l := register(t, client(t, url), 9, "", WithHeartbeat(time.Hour))
	_, err := w.WaitForInstances(context.Background())
	require.NoError(t, err)

	start := time.Now()
	ch := w.Changes()
	l.Close()
	<-ch
	elapsed := waitGone(t, w, 9, 500*time.Millisecond)
	t.Logf("gone %s after Close returned (%s total)", elapsed, time.Since(start))
	assert.Empty(t, w.Instances())

	// A watcher started afterwards does not see it either.
	assert.Empty(t, watch(t, nc).Instances())
}

func TestDeadProcessExpiresWithinTTL(t *testing.T) {
	const (
		heartbeat = 50 * time.Millisecond
		ttl       = 300 * time.Millisecond
	)
	nc, url := legacyServer(t)
	w := watch(t, nc, WithTTL(ttl))
	dying := client(t, url)
	register(t, dying, 11, "", WithHeartbeat(heartbeat))
	register(t, client(t, url), 12, "", WithHeartbeat(heartbeat))
	_, err := w.WaitForInstances(context.Background())
	require.NoError(t, err)

	// Heartbeats keep both alive across several TTLs.
	time.Sleep(2 * ttl)
	require.Equal(t, []uint64{11, 12}, ids(w.Instances()))

	// The process dies: its connection drops, no "down" is ever sent.
	dying.Close()
	elapsed := waitGone(t, w, 11, 2*ttl)
	t.Logf("dead instance gone after %s (TTL %s)", elapsed, ttl)
	// TTL + TTL/4 is the guarantee; the rest is slack for a loaded machine.
	assert.LessOrEqual(t, elapsed, ttl+ttl/4+200*time.Millisecond)
	assert.Equal(t, []uint64{12}, ids(w.Instances()))
}

func TestDefaultTimingsMeetFiveSeconds(t *testing.T) {
	assert.LessOrEqual(t, DefaultTTL+DefaultTTL/4, 5*time.Second)
	assert.Less(t, DefaultHeartbeat, DefaultTTL/2)
}

func TestRequestToDeadInstanceFailsWithNoResponders(t *testing.T) {
	nc, url := server(t)
	worker := client(t, url)
	id := NewInstanceID()
	_, err := worker.Subscribe(RequestSubject(path, id), func(m *nats.Msg) { _ = m.Respond([]byte("ok")) })
	require.NoError(t, err)
	register(t, worker, id, "")
	require.NoError(t, worker.Flush())

	reply, err := nc.Request(RequestSubject(path, id), []byte("hi"), time.Second)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(reply.Data))

	worker.Close()
	// The server drops the dead connection's subscriptions when it reads
	// the EOF, a moment after the close; a request sent in that moment is
	// forwarded to the dead socket and times out. Once dropped, requests
	// fail at once.
	deadline := time.Now().Add(2 * time.Second)
	for {
		_, err = nc.Request(RequestSubject(path, id), []byte("hi"), 50*time.Millisecond)
		if errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			break
		}
	}
	require.ErrorIs(t, err, nats.ErrNoResponders)
	start := time.Now()
	_, err = nc.Request(RequestSubject(path, id), []byte("hi"), 5*time.Second)
	elapsed := time.Since(start)
	require.ErrorIs(t, err, nats.ErrNoResponders)
	t.Logf("request to dead instance failed after %s", elapsed)
	assert.Less(t, elapsed, time.Second, "no waiting for the 5 s timeout")

	// A never-registered id fails the same way.
	_, err = nc.Request(RequestSubject(path, NewInstanceID()), nil, 5*time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders)
}

// A late "up" of a lease that already said "down" must not resurrect it; a
// new lease reusing the id is a new registration. Announcements carry the
// lease's proof ("up") and secret ("down"), as Register sends them.
func TestStaleUpAfterDownIgnored(t *testing.T) {
	nc, _ := server(t)
	w := watch(t, nc, WithTTL(time.Hour))
	send := func(a announcement) {
		data, err := json.Marshal(a)
		require.NoError(t, err)
		require.NoError(t, nc.Publish(announceSubject(path), data))
		require.NoError(t, nc.Flush())
	}
	secret := func(lease uint64) string { return fmt.Sprintf("secret-%d", lease) }
	up := func(id, lease uint64) announcement {
		return announcement{Op: opUp, ID: id, Lease: lease, Proof: proofOf(secret(lease))}
	}
	down := func(id, lease uint64) announcement {
		return announcement{Op: opDown, ID: id, Lease: lease, Secret: secret(lease)}
	}
	probeLease := uint64(1000)
	settle := func() { // own messages come back in order; a probe marks the end
		probeLease++ // a new lease each time: a closed one cannot come back
		send(up(999, probeLease))
		require.Eventually(t, func() bool { return contains(w.Instances(), 999) }, time.Second, time.Millisecond)
		send(down(999, probeLease))
		require.Eventually(t, func() bool { return !contains(w.Instances(), 999) }, time.Second, time.Millisecond)
	}
	send(down(5, 1))
	send(up(5, 1))
	settle()
	assert.Empty(t, w.Instances())

	send(up(5, 2))
	require.Eventually(t, func() bool { return contains(w.Instances(), 5) }, time.Second, time.Millisecond)
	// A "down" of the old lease does not remove the new one.
	send(down(5, 1))
	settle()
	assert.Equal(t, []uint64{5}, ids(w.Instances()))

	// Malformed messages are ignored.
	require.NoError(t, nc.Publish(announceSubject(path), []byte("not json")))
	send(announcement{Op: "sideways", ID: 6, Lease: 1})
	send(announcement{Op: opUp, ID: 0, Lease: 1})
	settle()
	assert.Equal(t, []uint64{5}, ids(w.Instances()))
}

// Only the lease itself can withdraw its instance: a "down" forged by
// another process on the bus, which has seen the instance's announcements
// (id, lease nonce, proof) but not its secret, is ignored, before or after
// the "up". So is an "up" that speaks for the lease with another proof.
func TestForgedDownIgnored(t *testing.T) {
	nc, url := legacyServer(t)
	w := watch(t, nc, WithTTL(time.Hour))
	reg := client(t, url)
	spy, err := reg.SubscribeSync(announceSubject(path))
	require.NoError(t, err)
	require.NoError(t, reg.Flush())
	l := register(t, reg, 7, "m")
	msg, err := spy.NextMsg(5 * time.Second)
	require.NoError(t, err)
	var seen announcement
	require.NoError(t, json.Unmarshal(msg.Data, &seen))
	require.NotEmpty(t, seen.Proof)
	_, err = w.WaitForInstances(context.Background())
	require.NoError(t, err)

	forger := client(t, url)
	for _, fake := range []announcement{
		{Op: opDown, ID: 7, Lease: seen.Lease},
		{Op: opDown, ID: 7, Lease: seen.Lease, Secret: seen.Proof},
		{Op: opDown, ID: 7, Lease: seen.Lease, Secret: "guess"},
		{Op: opUp, ID: 7, Lease: seen.Lease, Proof: proofOf("mine"), Meta: []byte("hijacked")},
	} {
		data, err := json.Marshal(fake)
		require.NoError(t, err)
		require.NoError(t, forger.Publish(announceSubject(path), data))
	}
	require.NoError(t, forger.Flush())
	time.Sleep(100 * time.Millisecond)
	got := w.Instances()
	require.Len(t, got, 1)
	assert.Equal(t, uint64(7), got[0].ID)
	assert.NotEqual(t, "hijacked", string(got[0].Meta))

	// The real "down" works.
	l.Close()
	require.Eventually(t, func() bool { return len(w.Instances()) == 0 }, 5*time.Second, time.Millisecond)
}

func TestMetadataChangeNotifies(t *testing.T) {
	nc, url := server(t)
	w := watch(t, nc)
	reg := client(t, url)
	l := register(t, reg, 1, "v1")
	_, err := w.WaitForInstances(context.Background())
	require.NoError(t, err)

	ch := w.Changes()
	l.Close()
	register(t, reg, 1, "v2")
	select {
	case <-ch:
	case <-time.After(time.Second):
		t.Fatal("no change notification")
	}
	require.Eventually(t, func() bool {
		inst := w.Instances()
		return len(inst) == 1 && string(inst[0].Meta) == "v2"
	}, time.Second, time.Millisecond)
}

func TestInstancesIsACopy(t *testing.T) {
	nc, _ := server(t)
	w := watch(t, nc)
	register(t, nc, 1, "meta")
	inst, err := w.WaitForInstances(context.Background())
	require.NoError(t, err)
	inst[0].Meta[0] = 'X'
	assert.Equal(t, "meta", string(w.Instances()[0].Meta))
}

// The snapshot is rebuilt only when the instance set changes: heartbeats
// that change nothing keep it, an addition or a removal replaces it.
func TestSnapshotRebuiltOnChangeOnly(t *testing.T) {
	nc, url := server(t)
	w := watch(t, nc)
	assert.Zero(t, w.Snapshot().Len())
	reg := client(t, url)
	register(t, reg, 5, "five", WithHeartbeat(10*time.Millisecond))
	_, err := w.WaitForInstances(context.Background())
	require.NoError(t, err)
	first := w.Snapshot()
	require.Equal(t, []Instance{{ID: 5, Meta: []byte("five")}}, first.Instances())
	time.Sleep(100 * time.Millisecond) // ~10 heartbeats of an unchanged instance
	assert.Same(t, first, w.Snapshot(), "a heartbeat that changes nothing rebuilt the snapshot")
	allocs := testing.AllocsPerRun(100, func() { _ = w.Snapshot() })
	assert.Zero(t, allocs)

	ch := w.Changes()
	l := register(t, reg, 3, "three")
	<-ch
	second := w.Snapshot()
	assert.NotSame(t, first, second)
	assert.Equal(t, []uint64{3, 5}, ids(second.Instances()))
	assert.Equal(t, []uint64{5}, ids(first.Instances()), "a snapshot handed out changed")

	ch = w.Changes()
	l.Close()
	<-ch
	assert.Equal(t, []uint64{5}, ids(w.Snapshot().Instances()))
	w.Close()
	assert.Zero(t, w.Snapshot().Len())
}

func TestWaitForInstancesEnds(t *testing.T) {
	nc, _ := server(t)
	w := watch(t, nc)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := w.WaitForInstances(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	errc := make(chan error, 1)
	go func() {
		_, err := w.WaitForInstances(context.Background())
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	w.Close()
	require.ErrorIs(t, <-errc, ErrClosed)
	_, err = w.WaitForInstances(context.Background())
	require.ErrorIs(t, err, ErrClosed)
	select {
	case <-w.Changes():
	default:
		t.Fatal("Changes must be closed after Close")
	}
	assert.Empty(t, w.Instances())
}

func TestWatchContextCancelled(t *testing.T) {
	nc, _ := server(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Watch(ctx, nc, path)
	require.ErrorIs(t, err, context.Canceled)
}

func TestCloseIdempotentAndConcurrent(t *testing.T) {
	nc, _ := server(t)
	w := watch(t, nc)
	l := register(t, nc, 77, "")
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(l.Close)
		wg.Go(w.Close)
	}
	wg.Wait()
	l.Close()
	w.Close()
}

func TestLeaseOnClosedConnection(t *testing.T) {
	_, url := server(t)
	nc := client(t, url)
	nc.Close()
	_, err := Register(nc, path, 1, nil)
	require.Error(t, err)
	_, err = Watch(context.Background(), nc, path)
	require.Error(t, err)
}

func TestValidation(t *testing.T) {
	for _, p := range []string{"a.b.c", "dyn-amo.back_end.gen3", "ns.comp.ep"} {
		assert.NoError(t, ValidatePath(p), p)
	}
	for _, p := range []string{"", "a.b", "a.b.c.d", "a..c", "a.*.c", "a.b.>", "a.b c.d", ".b.c", "a.b.\x00", "a.b\u00a0.c", "a.b\tx.c"} {
		assert.ErrorIs(t, ValidatePath(p), ErrBadPath, p)
	}
	for _, n := range []string{"ns", "back_end-2", "générer"} {
		assert.NoError(t, ValidateName(n), n)
	}
	for _, n := range []string{"", "a.b", "a*", ">", "a b", "a\u2003b", "a\x7f"} {
		assert.ErrorIs(t, ValidateName(n), ErrBadPath, n)
	}
	_, err := Register(nil, "bad", 1, nil)
	require.Error(t, err)
	_, err = Register(nil, path, 0, nil)
	require.Error(t, err)
	_, err = Watch(context.Background(), nil, "a.b")
	require.Error(t, err)

	assert.Equal(t, "dc.req.demo.backend.generate.ff", RequestSubject(path, 255))
	for range 1000 {
		id := NewInstanceID()
		assert.NotZero(t, id)
		assert.Less(t, id, uint64(1)<<63)
	}
}
