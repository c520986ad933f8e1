package plane_test

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// capacityOf reads {"max_num_seqs": N} (0 when absent: unlimited).
func capacityOf(meta []byte) int {
	var m struct {
		MaxNumSeqs int `json:"max_num_seqs"`
	}
	_ = json.Unmarshal(meta, &m)
	return m.MaxNumSeqs
}

// Routing by free capacity: each request goes to the instance with the
// most free places; Reserve refuses when every one is full and a place
// comes back (with a call of onRoom) when a request ends.
func TestCapacityRoutesToTheMostFreeAndReserveRefusesWhenFull(t *testing.T) {
	const path = "test.capacity.generate"
	host := planetest.Embedded(t)
	got := make(chan *plane.Request, 16)
	small := planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got), planetest.WithMetadata([]byte(`{"max_num_seqs":1}`)))
	big := planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got), planetest.WithMetadata([]byte(`{"max_num_seqs":3}`)))
	c := planetest.Client(t, host, path)
	var rooms atomic.Int64
	c.SetCapacity(capacityOf, func() { rooms.Add(1) })
	planetest.WaitInstances(t, c, 2)

	// Free: small 1, big 3. The first three go to big (3, then 2 > 1; then
	// a tie of 1 and 1, either), four fill both.
	var streams []*plane.Stream
	for i := 0; i < 4; i++ {
		r, err := c.Reserve()
		require.NoError(t, err, "place %d", i)
		s, err := c.Generate([]byte(`{}`), ctxtree.New("cap"), plane.RoundRobin, 0, plane.WithReservation(r))
		require.NoError(t, err)
		streams = append(streams, s)
		planetest.Recv(t, got, "the request")
	}
	assert.Equal(t, map[uint64]int{small.EP.InstanceID(): 1, big.EP.InstanceID(): 3}, c.Running())
	_, err := c.Reserve()
	require.ErrorIs(t, err, plane.ErrAtCapacity, "every instance is full")

	// An attempt without a reservation is sent, but the workers, full,
	// refuse it as busy (their own count is the authority): it reached no
	// handler and its instance is not suspected.
	over, err := c.Generate([]byte(`{}`), ctxtree.New("over"), plane.RoundRobin, 0)
	require.NoError(t, err)
	require.ErrorIs(t, over.AwaitStart(t.Context()), plane.ErrBusy)
	assert.Empty(t, plane.Suspects(c), "a busy worker is not suspected")
	assert.Equal(t, map[uint64]int{small.EP.InstanceID(): 1, big.EP.InstanceID(): 3}, c.Running(), "its places are given back")

	before := rooms.Load()
	streams[0].Kill()
	require.Eventually(t, func() bool {
		r, err := c.Reserve()
		if err == nil {
			r.Release()
		}
		return err == nil
	}, planetest.WaitLimit, 2*time.Millisecond, "a place came back")
	assert.Greater(t, rooms.Load(), before, "onRoom was called")
	for _, s := range streams[1:] {
		s.Kill()
	}
}

// A reservation that is not used (or whose Generate fails) gives its
// place back; a request that finishes gives its place back.
func TestReservationIsReleasedOnEveryPath(t *testing.T) {
	const path = "test.capacity.release"
	host := planetest.Embedded(t)
	planetest.Serve(t, planetest.Join(t, host), path, planetest.Tokens, planetest.WithMetadata([]byte(`{"max_num_seqs":1}`)))
	c := planetest.Client(t, host, path)
	c.SetCapacity(capacityOf, nil)
	planetest.WaitInstances(t, c, 1)

	r, err := c.Reserve()
	require.NoError(t, err)
	r.Release()
	r.Release() // once only
	assert.Empty(t, c.Running())

	r, err = c.Reserve()
	require.NoError(t, err)
	_, err = c.Generate([]byte(`not json`), nil, plane.RoundRobin, 0, plane.WithReservation(r))
	require.Error(t, err)
	assert.Empty(t, c.Running(), "a refused request gave its place back")

	require.NoError(t, c.SetMigrationLimit(2))
	r, err = c.Reserve()
	require.NoError(t, err)
	s, err := c.Generate([]byte(`{"token_ids":[1],"stop_conditions":{"max_tokens":3}}`), nil, plane.RoundRobin, 0, plane.WithReservation(r))
	require.NoError(t, err)
	_, err = planetest.DrainTokens(t, s)
	require.Equal(t, io.EOF, err)
	require.Eventually(t, func() bool { return len(c.Running()) == 0 }, planetest.WaitLimit, 2*time.Millisecond, "the finished request gave its place back")
}

// Reserve under contention never hands out more places than there are.
func TestReserveNeverOvercommits(t *testing.T) {
	const path = "test.capacity.race"
	host := planetest.Embedded(t)
	planetest.Serve(t, planetest.Join(t, host), path, planetest.Tokens, planetest.WithMetadata([]byte(`{"max_num_seqs":5}`)))
	c := planetest.Client(t, host, path)
	c.SetCapacity(capacityOf, nil)
	planetest.WaitInstances(t, c, 1)
	var wg sync.WaitGroup
	var took atomic.Int64
	var mu sync.Mutex
	var held []*plane.Reservation
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := c.Reserve(); err == nil {
				took.Add(1)
				mu.Lock()
				held = append(held, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 5, took.Load())
	for _, r := range held {
		r.Release()
	}
	assert.Empty(t, c.Running())
}

// An instance avoided for a recent failure (one request it did not
// acknowledge) that has free places is admitted to rather than refusing:
// the suspicion may be a hiccup.
func TestReserveUsesASuspectWithRoomBeforeRefusing(t *testing.T) {
	const path = "test.capacity.suspect"
	host := planetest.Embedded(t)
	got := make(chan *plane.Request, 8)
	b := planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got), planetest.WithMetadata([]byte(`{"max_num_seqs":1}`)))
	a := planetest.BlackHole(t, host, path, []byte(`{"max_num_seqs":2}`)) // never acknowledges
	c := planetest.Client(t, host, path)
	c.SetCapacity(capacityOf, nil)
	planetest.WaitInstances(t, c, 2)

	s, err := c.Generate([]byte(`{}`), nil, plane.Direct, a)
	require.NoError(t, err)
	require.ErrorIs(t, planetest.WaitStarted(s), plane.ErrNotAcknowledged) // a is a suspect now
	r, err := c.Reserve()
	require.NoError(t, err)
	require.Equal(t, b.EP.InstanceID(), r.Instance(), "the healthy instance first")
	held, err := c.Generate([]byte(`{}`), ctxtree.New("held"), plane.RoundRobin, 0, plane.WithReservation(r))
	require.NoError(t, err)
	defer held.Kill()
	planetest.Recv(t, got, "the held request")

	r, err = c.Reserve()
	require.NoError(t, err, "the suspect has two free places")
	assert.Equal(t, a, r.Instance())
	r.Release()
}

// Under churn (migration through a black hole and a worker that breaks
// streams, kills at random moments, reservations used, released unused, or
// sent with bad payloads), every place comes back.
func TestPlacesComeBackUnderChurn(t *testing.T) {
	const path = "test.capacity.churn"
	host := planetest.Embedded(t)
	planetest.Serve(t, planetest.Join(t, host), path, planetest.Tokens, planetest.WithMetadata([]byte(`{"max_num_seqs":3}`)))
	planetest.Serve(t, planetest.Join(t, host), path, func(w *planetest.Worker, req *plane.Request) {
		// Half of the requests wait a moment after their first item.
		if len(req.ID)%2 == 0 {
			w.Send(req, planetest.TokenItem(0, ""))
			time.Sleep(time.Millisecond)
		}
		planetest.Tokens(w, req)
	}, planetest.WithMetadata([]byte(`{"max_num_seqs":2}`)))
	planetest.BlackHole(t, host, path, []byte(`{"max_num_seqs":2}`)) // never acknowledges

	c := planetest.Client(t, host, path)
	c.SetCapacity(capacityOf, nil)
	require.NoError(t, c.SetMigrationLimit(2))
	planetest.WaitInstances(t, c, 3)

	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var opts []plane.GenerateOption
			if r, err := c.Reserve(); err == nil {
				switch i % 5 {
				case 0:
					r.Release()
					return
				case 1:
					_, err := c.Generate([]byte(`nope`), nil, plane.RoundRobin, 0, plane.WithReservation(r))
					assert.Error(t, err)
					return
				}
				opts = append(opts, plane.WithReservation(r))
			}
			parent := ctxtree.New(fmt.Sprintf("churn-%d", i))
			s, err := c.Generate([]byte(`{"token_ids":[1],"stop_conditions":{"max_tokens":3}}`), parent, plane.RoundRobin, 0, opts...)
			if !assert.NoError(t, err) {
				return
			}
			switch i % 4 {
			case 0:
				s.Kill()
			case 1:
				time.Sleep(time.Duration(i%13) * time.Millisecond)
				s.Kill()
			}
			_, _ = planetest.DrainTokens(t, s)
			s.Kill()
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return len(c.Running()) == 0 }, 15*time.Second, 10*time.Millisecond, "places left: %v", c.Running())
}

// Closing the caller's runtime with requests in flight, in the backoff
// between migration attempts and before dispatch, gives every place back.
func TestPlacesComeBackWhenTheRuntimeCloses(t *testing.T) {
	const path = "test.capacity.rtclose"
	host := planetest.Embedded(t)
	got := make(chan *plane.Request, 64)
	planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got), planetest.WithMetadata([]byte(`{"max_num_seqs":3}`)))
	planetest.BlackHole(t, host, path, []byte(`{"max_num_seqs":2}`)) // never acknowledges

	crt := planetest.Join(t, host)
	c := planetest.Client(t, crt, path)
	c.SetCapacity(capacityOf, nil)
	require.NoError(t, c.SetMigrationLimit(3))
	planetest.WaitInstances(t, c, 2)
	var streams []*plane.Stream
	for i := 0; i < 20; i++ {
		var opts []plane.GenerateOption
		if r, err := c.Reserve(); err == nil {
			opts = append(opts, plane.WithReservation(r))
		}
		s, err := c.Generate([]byte(`{}`), ctxtree.New(fmt.Sprint("c", i)), plane.RoundRobin, 0, opts...)
		require.NoError(t, err)
		streams = append(streams, s)
	}
	time.Sleep(1200 * time.Millisecond) // some were not acknowledged: migrating
	crt.Close()
	require.Eventually(t, func() bool { return len(c.Running()) == 0 }, 15*time.Second, 10*time.Millisecond, "places left: %v", c.Running())
	for _, s := range streams {
		s.Kill()
	}
}

// An instance that declares no capacity counts as the largest declared one:
// it shares the load with an instance that declares a capacity instead of
// taking it all.
func TestUndeclaredCapacitySharesTheLoad(t *testing.T) {
	const path = "test.capacity.mixed"
	host := planetest.Embedded(t)
	got := make(chan *plane.Request, 64)
	declared := planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got), planetest.WithMetadata([]byte(`{"max_num_seqs":8}`)))
	planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got))
	c := planetest.Client(t, host, path)
	c.SetCapacity(capacityOf, nil)
	planetest.WaitInstances(t, c, 2)
	for i := 0; i < 20; i++ {
		s, err := c.Generate([]byte(`{}`), ctxtree.New(fmt.Sprint("m", i)), plane.RoundRobin, 0)
		require.NoError(t, err)
		defer s.Kill()
		planetest.Recv(t, got, "a request")
	}
	assert.Positive(t, c.Running()[declared.EP.InstanceID()], "20 requests, all on the undeclared instance: %v", c.Running())
}
