package plane_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// The ways a caller takes a direct stream's items (request-plane.md,
// "Credits and bounded buffers"): Take and Arm (Python's stream_take),
// Batch.TakeInto into a small buffer, and Next with a deadline per call
// (the frontend's response), some of them very short.
const (
	byTake = iota
	byTakeInto
	byNext
	consumerKinds
)

// consume takes s's items the given way until its end, which it returns;
// a slow consumer pauses now and then, so that the worker runs out of
// credit and waits for it.
func consume(s *plane.Stream, kind int, slow bool) ([][]byte, error) {
	var got [][]byte
	pause := func() {
		if slow && rand.IntN(20) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if kind == byNext {
		for {
			limit, short := planetest.WaitLimit, rand.IntN(10) == 0
			if short {
				limit = time.Duration(1+rand.IntN(200)) * time.Microsecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), limit)
			item, err := s.Next(ctx)
			cancel()
			switch {
			case err == nil:
				got = append(got, item)
				pause()
			case short && errors.Is(err, context.DeadlineExceeded):
			default:
				return got, err
			}
		}
	}
	// Take and TakeInto: what is there, else ErrAgain, and an arm to wait on.
	take, arm := func() ([][]byte, error) { return s.Take(rand.IntN(5)) }, s.Arm // 0: all there is
	if kind == byTakeInto {
		b := plane.NewBatch(s)
		buf := make([]byte, 10+rand.IntN(40))
		take = func() ([][]byte, error) {
			_, k, err := b.TakeInto(buf)
			items := make([][]byte, 0, k)
			for i, off := 0, 0; i < k; i++ {
				n := int(binary.LittleEndian.Uint32(buf[off:]))
				items = append(items, append([]byte(nil), buf[off+4:off+4+n]...))
				off += 4 + n
			}
			return items, err
		}
		arm = b.Arm
	}
	for {
		items, err := take()
		switch {
		case err == nil:
			got = append(got, items...)
			pause()
		case errors.Is(err, plane.ErrAgain):
			if err := planetest.WaitArm(arm); err != nil {
				return got, err
			}
		default:
			return got, err
		}
	}
}

// Many direct streams at once, each of a few items or of several credit
// windows (256 items), taken each of the ways above, some slowly: every
// item arrives once, in order, and all of them before the end.
func TestDirectStreamsGiveEveryItemOnceInOrder(t *testing.T) {
	const path = "test.direct.generate"
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		n, _ := strconv.Atoi(string(req.Payload))
		for i := 0; i < n; i++ {
			if !w.Send(req, num(i)) {
				return
			}
			if i%97 == 0 {
				runtime.Gosched()
			}
		}
		req.Complete()
	})
	const consumers = 8
	rounds := 30
	if testing.Short() {
		rounds = 8
	}
	var wg sync.WaitGroup
	errs := make(chan error, consumers*rounds)
	for p := 0; p < consumers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				n := []int{0, 1, 2, 255, 256, 257, 700}[rand.IntN(7)]
				s, err := c.Generate([]byte(strconv.Itoa(n)), nil, plane.RoundRobin, 0)
				if err != nil {
					errs <- err
					return
				}
				kind := (p + r) % consumerKinds
				got, err := consume(s, kind, rand.IntN(4) == 0)
				switch {
				case err != io.EOF:
					errs <- fmt.Errorf("consumer %d: ended by %v after %d items of %d", kind, err, len(got), n)
					s.Kill()
				case !slices.EqualFunc(got, nums(n), bytes.Equal):
					errs <- fmt.Errorf("consumer %d: %d items of %d, or not in order: %q", kind, len(got), n, got)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A direct stream killed at any moment while its consumer takes or waits:
// the consumer sees the end (io.EOF), never a hang.
func TestDirectStreamKillEndsAWaitingConsumer(t *testing.T) {
	const path = "test.directkill.generate"
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		for i := 0; ; i++ {
			if !w.Send(req, num(i)) {
				return
			}
			if rand.IntN(50) == 0 {
				time.Sleep(50 * time.Microsecond)
			}
		}
	})
	rounds := 200
	if testing.Short() {
		rounds = 40
	}
	for r := 0; r < rounds; r++ {
		s := planetest.Generate(t, c, `{}`, nil)
		go func() {
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			s.Kill()
		}()
		done := make(chan error, 1)
		kind := []int{byTake, byNext}[r%2]
		go func() {
			_, err := consume(s, kind, true)
			done <- err
		}()
		select {
		case err := <-done:
			require.Equal(t, io.EOF, err, "round %d, consumer %d", r, kind)
		case <-time.After(planetest.WaitLimit):
			assert.Fail(t, "a killed stream's consumer hangs", "round %d, consumer %d", r, kind)
			return
		}
	}
}
