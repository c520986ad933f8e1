package discovery

// The discovery stream: JetStream holds each instance's state, and its
// message scheduler is each lease's dead man's switch.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// streamName is the one JetStream stream of discovery, for every
	// namespace: its subjects are statePrefix and timerPrefix.
	streamName = "DC_DISCOVERY"
	// statePrefix + path + "." + hex id holds an instance's state: its
	// "up", then its "down" or "expired". Watchers consume these subjects
	// only, so they receive changes, never liveness.
	statePrefix = "dc.disc.s."
	// timerPrefix + path + "." + hex id holds the lease's schedule: every
	// heartbeat replaces it, and when heartbeats stop it fires, writing
	// "expired" on the state subject (see Lease).
	timerPrefix = "dc.disc.t."
	// streamReplicas is the stream's replication in a cluster of three or
	// more nodes: it survives the loss of one. On a single server, 1.
	streamReplicas = 3
	// goneTTL is how long a "down" or "expired" stays in the stream. Only
	// a watcher that falls further behind than this without noticing a
	// gap could miss one; any gap, a silence or a reconnection makes a
	// watcher read the stream afresh (resync) instead.
	goneTTL = 10 * time.Minute
	// jsTimeout bounds each JetStream request of discovery.
	jsTimeout = 2 * time.Second
)

// JetStream headers that nats.go does not name (nats-server 2.12+).
const (
	hdrTTL          = "Nats-TTL"
	hdrSchedule     = "Nats-Schedule"
	hdrTarget       = "Nats-Schedule-Target"
	hdrScheduleTTL  = "Nats-Schedule-TTL"
	hdrScheduler    = "Nats-Scheduler"
	hdrExpectSeq    = "Nats-Expected-Last-Subject-Sequence"
	hdrExpectSubj   = "Nats-Expected-Last-Subject-Sequence-Subject"
	hdrLastConsumer = "Nats-Last-Consumer"
	hdrStalled      = "Nats-Consumer-Stalled"
)

func stateSubject(path string, id uint64) string {
	return statePrefix + path + "." + strconv.FormatUint(id, 16)
}

func timerSubject(path string, id uint64) string {
	return timerPrefix + path + "." + strconv.FormatUint(id, 16)
}

// streamConfig is the discovery stream: in memory (the state is rebuilt
// by the leases whenever it is lost), one message per subject (an
// instance's latest state; its latest schedule), per-message TTLs and
// schedules.
func streamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              streamName,
		Description:       "dynamo-ctx discovery: instance states and lease schedules",
		Subjects:          []string{"dc.disc.>"},
		Storage:           jetstream.MemoryStorage,
		Replicas:          replicas,
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardOld,
		AllowRollup:       true,
		AllowMsgTTL:       true,
		AllowMsgSchedules: true,
	}
}

// errNoJetStream means the server has no JetStream: discovery falls back
// to heartbeats to every watcher.
var errNoJetStream = errors.New("discovery: the NATS server has no JetStream")

// ensureStream makes sure the discovery stream exists: it returns
// errNoJetStream when the server has no JetStream at all, and retries
// while JetStream is temporarily unavailable (a cluster electing its
// leaders) until ctx ends.
func ensureStream(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for {
		err := ensureOnce(ctx, js)
		if err == nil || errors.Is(err, errNoJetStream) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("discovery: the discovery stream: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func ensureOnce(ctx context.Context, js jetstream.JetStream) error {
	rctx, cancel := context.WithTimeout(ctx, jsTimeout)
	defer cancel()
	_, err := js.Stream(rctx, streamName)
	if err == nil {
		return nil
	}
	if noJetStream(err) {
		return errNoJetStream
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	_, err = js.CreateStream(rctx, streamConfig(streamReplicas))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// A single server, or a cluster of fewer than three nodes.
		_, err = js.CreateStream(rctx, streamConfig(1))
	}
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil // another process made it first
	}
	return err
}

// noJetStream reports an error that says the server (or the account) has
// no JetStream: nobody answers the JetStream API, or it says so.
func noJetStream(err error) bool {
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrNoResponders)
}

// publish stores m in the discovery stream and returns its sequence.
func publish(ctx context.Context, nc *nats.Conn, m *nats.Msg) (uint64, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, jsTimeout)
	defer cancel()
	ack, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(streamName), jetstream.WithRetryAttempts(0))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// wrongLast reports that a publish found another message than expected on
// the subject it checked: the lease's state was overwritten.
func wrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// streamGone reports that the stream is not there to take a publish (a
// replacement server after a takeover knows nothing of it).
func streamGone(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrStreamNotFound)
}
