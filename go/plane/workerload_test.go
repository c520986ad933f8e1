package plane_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// concurrency counts the handlers running on a worker and the most at once.
type concurrency struct{ now, peak atomic.Int64 }

func (c *concurrency) enter() {
	n := c.now.Add(1)
	for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
	}
}

func (c *concurrency) leave() { c.now.Add(-1) }

// A worker's capacity holds whoever sends: several callers, with and
// without routing by capacity, hammer one worker of capacity 4 with
// requests that complete, fail, are killed mid-stream, are cancelled before
// they are sent, or lose their caller (a runtime closed under them); then
// its endpoint is closed under held requests. Never more than 4 handlers
// run at once, a request past that is refused as busy (and only that: no
// other error), and every place comes back: none leaks, refused or not.
func TestWorkerCapacityHoldsUnderAHammer(t *testing.T) {
	const path, capacity = "test.workerload.generate", 4
	host := planetest.Embedded(t)
	var cc concurrency
	handler := func(w *planetest.Worker, req *plane.Request) {
		cc.enter()
		defer cc.leave()
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		switch string(req.Payload) {
		case `"fail"`:
			req.Fail("ValueError: on purpose")
		case `"hold"`:
			select {
			case <-req.Ctx.Killed():
			case <-w.Quit:
			}
		default:
			w.Send(req, []byte(`1`))
		}
	}
	worker := planetest.Serve(t, planetest.Join(t, host), path, handler,
		planetest.WithMetadata(fmt.Appendf(nil, `{"max_num_seqs":%d}`, capacity)))

	var callers []*plane.Client
	for i := range 3 {
		c := planetest.Client(t, planetest.Join(t, host), path)
		if i < 2 {
			c.SetCapacity(capacityOf, nil)
		}
		planetest.WaitInstances(t, c, 1)
		callers = append(callers, c)
	}
	var busy, ended atomic.Int64
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := callers[g%len(callers)]
			for i := range 25 {
				payload := []string{`"done"`, `"fail"`, `"hold"`, `"done"`}[(g+i)%4]
				parent := ctxtree.New(fmt.Sprintf("h%d-%d", g, i))
				s, err := c.Generate([]byte(payload), parent, plane.RoundRobin, 0)
				if !assert.NoError(t, err) {
					return
				}
				switch i % 5 {
				case 1: // cancelled at once, maybe before it is sent
					parent.Kill()
				case 2, 3: // killed once it runs
					if s.AwaitStart(t.Context()) == nil {
						time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
					}
					s.Kill()
				}
				if payload == `"hold"` {
					s.Kill()
				}
				err = drainAll(s)
				var he *plane.HandlerError
				switch {
				case errors.Is(err, plane.ErrBusy):
					busy.Add(1)
				case err == nil, errors.Is(err, io.EOF), errors.As(err, &he):
					ended.Add(1)
				default:
					assert.NoError(t, err, "request %d-%d (%s)", g, i, payload)
				}
			}
		}()
	}
	// A caller that goes away with requests held on the worker.
	gone := planetest.Join(t, host)
	gc := planetest.Client(t, gone, path)
	planetest.WaitInstances(t, gc, 1)
	for i := range 3 {
		_, err := gc.Generate([]byte(`"hold"`), ctxtree.New(fmt.Sprintf("gone%d", i)), plane.RoundRobin, 0)
		require.NoError(t, err)
	}
	time.Sleep(20 * time.Millisecond)
	gone.Close()
	wg.Wait()

	// The endpoint closed under held requests gives their places back too.
	held := planetest.Client(t, planetest.Join(t, host), path)
	planetest.WaitInstances(t, held, 1)
	for i := range capacity {
		s, err := held.Generate([]byte(`"hold"`), ctxtree.New(fmt.Sprintf("held%d", i)), plane.RoundRobin, 0)
		require.NoError(t, err)
		require.NoError(t, s.AwaitStart(t.Context()), "held %d", i)
	}
	rep, _, _ := worker.EP.Load()
	assert.Equal(t, capacity, rep.Running)
	worker.EP.Close()
	require.Eventually(t, func() bool { rep, _, _ := worker.EP.Load(); return rep.Running == 0 },
		planetest.WaitLimit, time.Millisecond, "every place came back")

	_, refused, peak := worker.EP.Load()
	t.Logf("ended %d, busy %d (refusals %d), peak %d", ended.Load(), busy.Load(), refused, peak)
	assert.LessOrEqual(t, cc.peak.Load(), int64(capacity), "handlers at once")
	assert.LessOrEqual(t, peak, capacity, "places at once")
	assert.Positive(t, refused, "the hammer went past the capacity")
	assert.Equal(t, int64(24*25), ended.Load()+busy.Load(), "every request ended one way")
}

// A caller that thinks an instance free (it has no report of it yet) sends
// a request there; the worker, full of another caller's requests, refuses
// it as busy with its load, and the request goes on to the instance with a
// free place within the same attempt: no error, no suspicion. The caller now
// knows: with every place taken, its Reserve refuses and a request sent
// anyway ends with ErrBusy; when a place frees, the worker's load report
// tells it (onRoom) and it is admitted again.
func TestBusyRefusalReroutesAndLoadReportsFreeTheView(t *testing.T) {
	const path = "test.workerload.reroute"
	host := planetest.Embedded(t)
	got := make(chan *plane.Request, 16)
	big := planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got), planetest.WithMetadata([]byte(`{"max_num_seqs":2}`)))
	small := planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got), planetest.WithMetadata([]byte(`{"max_num_seqs":1}`)))

	// Another frontend fills big; once its report says so (the last it
	// publishes while nothing changes), the caller under test comes.
	reports := make(chan *nats.Msg, 64)
	sub, err := plane.NC(host).ChanSubscribe(plane.LoadSubject(path), reports)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	other := planetest.Client(t, planetest.Join(t, host), path)
	planetest.WaitInstances(t, other, 2)
	var held []*plane.Stream
	for i := range 2 {
		s, err := other.Generate([]byte(`{}`), ctxtree.New(fmt.Sprintf("other%d", i)), plane.Direct, big.EP.InstanceID())
		require.NoError(t, err)
		require.NoError(t, s.AwaitStart(t.Context()))
		held = append(held, s)
	}
	for {
		var rep plane.LoadReport
		require.NoError(t, json.Unmarshal(planetest.Recv(t, reports, "big's report").Data, &rep))
		if rep.Instance == big.EP.InstanceID() && rep.Running == 2 {
			assert.Equal(t, plane.LoadReport{Instance: rep.Instance, Gen: rep.Gen, Running: 2, Capacity: 2}, rep)
			break
		}
	}

	// This one started after big's report: it believes big has 2 free.
	c := planetest.Client(t, planetest.Join(t, host), path)
	var rooms atomic.Int64
	c.SetCapacity(capacityOf, func() { rooms.Add(1) })
	planetest.WaitInstances(t, c, 2)
	r, err := c.Reserve()
	require.NoError(t, err)
	require.Equal(t, big.EP.InstanceID(), r.Instance(), "it believes big the most free")
	s, err := c.Generate([]byte(`{}`), ctxtree.New("mine"), plane.RoundRobin, 0, plane.WithReservation(r))
	require.NoError(t, err)
	require.NoError(t, s.AwaitStart(t.Context()), "rerouted, not failed")
	assert.Equal(t, small.EP.InstanceID(), s.Instance())
	assert.Empty(t, plane.Suspects(c))
	assert.Equal(t, map[uint64]int{small.EP.InstanceID(): 1}, c.Running())
	_, refused, _ := big.EP.Load()
	assert.Equal(t, uint64(1), refused)

	_, err = c.Reserve()
	require.ErrorIs(t, err, plane.ErrAtCapacity, "big is known full now, small is full of its own")
	over, err := c.Generate([]byte(`{}`), ctxtree.New("over"), plane.RoundRobin, 0)
	require.NoError(t, err)
	require.ErrorIs(t, over.AwaitStart(t.Context()), plane.ErrBusy)

	before := rooms.Load()
	held[0].Kill()
	require.Eventually(t, func() bool { return rooms.Load() > before }, planetest.WaitLimit, time.Millisecond, "big's report freed a place")
	require.Eventually(t, func() bool {
		r, err := c.Reserve()
		if err != nil {
			return false
		}
		defer r.Release()
		return r.Instance() == big.EP.InstanceID()
	}, planetest.WaitLimit, time.Millisecond, "admitted on big again")
	s.Kill()
	held[1].Kill()
}
