package plane_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
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
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		switch string(req.Payload) {
		case `"fail"`:
			// The handler's work ends here, and its request's end gives the
			// place back at once: the Python dispatcher fails a request after
			// its handler returned. Counted after Fail, the next handler could
			// start in between and be counted a fifth.
			cc.leave()
			req.Fail("ValueError: on purpose")
			return
		case `"hold"`:
			select {
			case <-req.Ctx.Killed():
			case <-w.Quit:
			}
		default:
			w.Send(req, []byte(`1`))
		}
		cc.leave() // the worker completes the request after this returns
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

// waitReport reads reports until one of instance id satisfies ok.
func waitReport(t *testing.T, reports <-chan *nats.Msg, id uint64, ok func(plane.LoadReport) bool) plane.LoadReport {
	t.Helper()
	for {
		var rep plane.LoadReport
		require.NoError(t, json.Unmarshal(planetest.Recv(t, reports, "a load report").Data, &rep))
		if rep.Instance == id && ok(rep) {
			return rep
		}
	}
}

// reservesOn says whether c's next reservation is on instance id (and
// gives it back).
func reservesOn(c *plane.Client, id uint64) bool {
	r, err := c.Reserve()
	if err != nil {
		return false
	}
	defer r.Release()
	return r.Instance() == id
}

// settlesOn waits until c's reservations are all on instance id: 20 in a
// row (a tie would alternate them), once c has the reports that say so.
func settlesOn(t *testing.T, c *plane.Client, id uint64, why string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for range 20 {
			if !reservesOn(c, id) {
				return false
			}
		}
		return true
	}, planetest.WaitLimit, time.Millisecond, why)
}

// An engine's own figures (SetEngineLoad: waiting requests, KV usage) go
// out in the endpoint's load reports, and a caller routing by capacity
// weighs them: with the same free places, the instance whose engine holds
// requests back, or whose KV cache is fuller, is passed over for the
// other. A figure left out (negative) is absent from the report.
func TestEngineLoadIsReportedAndWeighed(t *testing.T) {
	const path = "test.workerload.engine"
	host := planetest.Embedded(t)
	got := make(chan *plane.Request, 16)
	meta := planetest.WithMetadata([]byte(`{"max_num_seqs":4}`))
	a := planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got), meta)
	b := planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got), meta)
	reports := make(chan *nats.Msg, 64)
	sub, err := plane.NC(host).ChanSubscribe(plane.LoadSubject(path), reports)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	crt := planetest.Join(t, host)
	c := planetest.Client(t, crt, path)
	c.SetCapacity(capacityOf, nil)
	require.NoError(t, plane.NC(crt).Flush(), "c listens to the reports before they come")
	planetest.WaitInstances(t, c, 2)
	ptr := func(w int, kv float64) (*int, *float64) { return &w, &kv }

	// a's engine holds 2 requests back: b has the more effective places.
	a.EP.SetEngineLoad(2, 0.5)
	rep := waitReport(t, reports, a.EP.InstanceID(), func(r plane.LoadReport) bool { return r.Waiting != nil })
	w, kv := ptr(2, 0.5)
	assert.Equal(t, plane.LoadReport{Instance: rep.Instance, Gen: rep.Gen, Capacity: 4, Free: 4, Waiting: w, KVUsage: kv}, rep)
	settlesOn(t, c, b.EP.InstanceID(), "never a, whose engine holds requests back")

	// Nothing waits anywhere; b's KV cache is the fuller: a is the pick.
	a.EP.SetEngineLoad(0, 0.2)
	b.EP.SetEngineLoad(0, 0.7)
	waitReport(t, reports, b.EP.InstanceID(), func(r plane.LoadReport) bool { return r.KVUsage != nil && *r.KVUsage == 0.7 })
	settlesOn(t, c, a.EP.InstanceID(), "never b, whose KV cache is fuller")

	// A report past any engine's count (a bus member's) overflows no score.
	a.EP.SetEngineLoad(math.MaxInt, 0.2)
	waitReport(t, reports, a.EP.InstanceID(), func(r plane.LoadReport) bool { return r.Waiting != nil && *r.Waiting == math.MaxInt })
	settlesOn(t, c, b.EP.InstanceID(), "never a, whose engine reports the most waiting")
	a.EP.SetEngineLoad(0, 0.2)
	waitReport(t, reports, a.EP.InstanceID(), func(r plane.LoadReport) bool { return r.Waiting != nil && *r.Waiting == 0 })

	// Free places come first: with 2 of a's taken, b is the pick again.
	var held []*plane.Stream
	for i := range 2 {
		s, err := c.Generate([]byte(`{}`), ctxtree.New(fmt.Sprintf("held%d", i)), plane.Direct, a.EP.InstanceID())
		require.NoError(t, err)
		require.NoError(t, s.AwaitStart(t.Context()))
		held = append(held, s)
	}
	assert.True(t, reservesOn(c, b.EP.InstanceID()))

	// Figures left out leave the report.
	a.EP.SetEngineLoad(-1, -1)
	rep = waitReport(t, reports, a.EP.InstanceID(), func(r plane.LoadReport) bool { return r.Waiting == nil })
	assert.Nil(t, rep.KVUsage)
	assert.Equal(t, 2, rep.Running)
	for _, s := range held {
		s.Kill()
	}
}
