package discovery

// A lease in the discovery stream: its "up" put once, a schedule re-armed
// at each heartbeat, and its "down" at Close.

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// streamLease is a Lease's state in the discovery stream. Only the lease's
// heartbeat goroutine uses it, then Close once that goroutine has ended.
//
// The instance's state subject holds its "up" from Register on; watchers
// read that subject, so they hear of the instance once. Each heartbeat
// replaces the message on the lease's timer subject: a schedule, "at this
// heartbeat's time plus the TTL, write 'expired' on the state subject".
// Each replacement moves that time on, so while heartbeats go on it never
// fires; when they stop (a crash, a partition) it fires a TTL after the
// last one, once, and the scheduler then removes it. So watchers receive
// a crashed instance's "expired" and nothing of the heartbeats: idle
// discovery costs the heartbeats to the stream, not heartbeats times
// watchers.
//
// The schedule is a time ("@at"), not an interval ("@every" TTL seconds,
// with a message TTL to end it after its first firing, as before): a
// schedule that comes due while the stream has no leader (a node lost, an
// election of several seconds) fires as soon as a new leader runs the
// scheduler, where an interval's message could expire by its own TTL
// during the election and never fire, leaving a lease that died then
// listed for ever. Its own TTL (goneTTL) only bounds what a stream that
// never fires it would keep. The time is the lease's clock: skew between
// the worker's clock and the servers' moves the expiry by as much, as it
// moves lateSlack's check.
//
// Each heartbeat's schedule is stored only if the state subject still
// holds the lease's "up" (an expected-sequence check): if anything else
// was written there (the scheduler fired during an outage of the stream,
// someone wrote over it) or the stream was lost (a replacement server),
// the heartbeat puts "up" again before arming.
type streamLease struct {
	state, timer string
	id, lease    uint64
	secs         int64 // the TTL in seconds
	// beatTimeout bounds a heartbeat's re-arm: one heartbeat period (at
	// most jsTimeout). A re-arm lost with the connection (its node died)
	// then holds the next heartbeat up for a period, not jsTimeout: with
	// a 1 s heartbeat, a 2 s wait and the tick it skipped let the schedule
	// come due (TTL 3 s) before the lease, reconnected at once to another
	// node, re-armed, and every watcher dropped a live instance until it
	// put "up" again (scalesim, a node that is not the stream's leader
	// lost at 1,000 workers: 136 drops).
	beatTimeout time.Duration
	// noStream: the last re-arm found no stream (a replacement server):
	// make sure it exists before putting "up" again.
	noStream bool
	upSeq    uint64 // sequence of our "up" on the state subject; 0: to put
	// ctx ends a heartbeat's requests when Close begins (stop), so that a
	// stream that does not answer (an election after a node loss) holds
	// Close up no longer than closeTimeout.
	ctx  context.Context
	stop context.CancelFunc
}

// closeTimeout bounds the "down" that Close writes: a worker that drains
// leaves discovery at once, or, with the stream unavailable, lets its
// schedule expire it.
const closeTimeout = time.Second

func newStreamLease(path string, id, lease uint64, ttl, heartbeat time.Duration) *streamLease {
	secs := max(int64((ttl+time.Second-1)/time.Second), 1)
	ctx, stop := context.WithCancel(context.Background())
	return &streamLease{ctx: ctx, stop: stop,
		state: stateSubject(path, id), timer: timerSubject(path, id),
		id: id, lease: lease, secs: secs, beatTimeout: min(max(heartbeat, 10*time.Millisecond), jsTimeout),
	}
}

// start arms the schedule, then puts "up": a crash between the two leaves
// an "expired" behind, never an "up" nobody expires.
func (s *streamLease) start(ctx context.Context, nc *nats.Conn, up []byte) error {
	for {
		err := s.arm(ctx, nc, false)
		if err == nil {
			s.upSeq, err = publish(ctx, nc, s.upMsg(up))
		}
		if err == nil {
			return nil
		}
		if streamGone(err) {
			if err := ensureStream(ctx, nc); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *streamLease) upMsg(up []byte) *nats.Msg {
	return &nats.Msg{Subject: s.state, Data: up, Header: nats.Header{}}
}

// arm replaces the schedule; checked, it is stored only while the state
// subject holds our "up".
func (s *streamLease) arm(ctx context.Context, nc *nats.Conn, checked bool) error {
	now := time.Now()
	body, err := json.Marshal(announcement{Op: opExpired, ID: s.id, Lease: s.lease, At: now.UnixNano(), TTL: s.secs})
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: s.timer, Data: body, Header: nats.Header{}}
	due := now.Add(time.Duration(s.secs) * time.Second)
	m.Header.Set(hdrSchedule, "@at "+due.UTC().Format(time.RFC3339Nano))
	m.Header.Set(hdrTarget, s.state)
	m.Header.Set(hdrScheduleTTL, goneTTL.String())
	m.Header.Set(hdrTTL, goneTTL.String())
	if checked {
		m.Header.Set(hdrExpectSeq, strconv.FormatUint(s.upSeq, 10))
		m.Header.Set(hdrExpectSubj, s.state)
	}
	_, err = publish(ctx, nc, m)
	return err
}

// beat is one heartbeat: re-arm, putting "up" again first when the state
// subject lost it (and making the stream first when it was lost). Errors
// are left to the next heartbeat: the schedule gives it TTL seconds.
func (s *streamLease) beat(nc *nats.Conn, up []byte) {
	if s.upSeq != 0 {
		ctx, cancel := context.WithTimeout(s.ctx, s.beatTimeout)
		err := s.arm(ctx, nc, true)
		cancel()
		if err == nil {
			return
		}
		if !wrongLast(err) && !streamGone(err) {
			return // a timeout, an outage: the next heartbeat tries again
		}
		s.upSeq, s.noStream = 0, streamGone(err)
	}
	if s.noStream {
		// Only then: after an election every lease whose "up" a doubted
		// "expired" overwrote puts it again at once, and a stream info
		// each would double what they ask of the stream's new leader.
		ctx, cancel := context.WithTimeout(s.ctx, jsTimeout)
		defer cancel()
		if err := ensureStream(ctx, nc); err != nil {
			return
		}
		s.noStream = false
	}
	if seq, err := publish(s.ctx, nc, s.upMsg(up)); err == nil {
		s.upSeq = seq
		_ = s.arm(s.ctx, nc, true)
	}
}

// close writes "down" on the state subject, then takes the schedule off
// (a message without one replaces it and expires a second later). A crash
// between the two lets the schedule write "expired" over the "down",
// which watchers ignore for a lease they dropped.
// Both writes together take at most closeTimeout.
func (s *streamLease) close(nc *nats.Conn, down []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	m := &nats.Msg{Subject: s.state, Data: down, Header: nats.Header{}}
	m.Header.Set(hdrTTL, goneTTL.String())
	_, _ = publish(ctx, nc, m)
	t := &nats.Msg{Subject: s.timer, Header: nats.Header{}}
	t.Header.Set(hdrTTL, "1s")
	_, _ = publish(ctx, nc, t)
}
