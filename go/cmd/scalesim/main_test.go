package main

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tiny is a configuration that runs every phase in a few seconds: short
// leases and windows, a handful of processes.
func tiny() config {
	return config{
		Servers: 3, Workers: 4, Callers: 2, Concurrency: 2, Items: 4,
		Heartbeat: 100 * time.Millisecond, TTL: 300 * time.Millisecond, Window: 300 * time.Millisecond,
		KillTrials: 1, Held: 20, Conns: 4, Crash: 1, Drain: 1, Wait: 20 * time.Second, FrontendRequests: 50,
	}
}

// One small point, end to end: the figures that do not depend on the
// machine's speed are exact.
func TestSimulateTiny(t *testing.T) {
	cfg := tiny()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	res, err := simulate(cfg, quiet, func(string) {})
	require.NoError(t, err)
	require.Empty(t, res.Errors)

	assert.Equal(t, cfg.Callers+1, res.Watchers, "every caller and worker 0 watch the endpoint")
	assert.InDelta(t, 1.0, res.NATSConnsPerProc, 1e-9, "one NATS connection per process")
	assert.Len(t, res.NATSClients, cfg.Servers)

	// Discovery: each announcement reaches every watcher.
	require.Positive(t, res.DiscPubs)
	assert.InDelta(t, float64(res.Watchers), res.DiscDeliv/res.DiscPubs, 0.5)
	assert.Greater(t, res.UpBytes, float64(len(meta)), "an announcement carries the metadata")

	// Requests: one envelope and one acknowledgement each.
	assert.Positive(t, res.Requests)
	assert.Zero(t, res.RequestErrors)
	assert.InDelta(t, 2.0, res.MsgsDeliv, 1e-9)
	assert.InDelta(t, 2.0, res.MsgsPub, 0.2)
	assert.LessOrEqual(t, res.MsgsRoute, 2.0)
	assert.LessOrEqual(t, res.Pairs, cfg.Callers*cfg.Workers)

	// Kill fan-out: every hop saw the kill, and each hop's abort
	// confirmation reached the one caller that sent it, once, whatever
	// the callers.
	assert.Equal(t, cfg.Workers, res.KillHops)
	assert.Zero(t, res.KillFailed, res.FirstError)
	assert.Positive(t, res.KillLastP50)
	assert.InDelta(t, 1.0, res.AbortDeliveries, 1e-9)
	assert.LessOrEqual(t, res.AbortRoute, 1.0)

	// Held streams.
	assert.Zero(t, res.HeldFailed, res.FirstError)
	assert.Equal(t, cfg.Held+cfg.Callers*min(cfg.Workers-1, cfg.Conns/cfg.Callers), res.StormStreams)
	assert.Positive(t, res.HeapPerStream)

	// The frontend routed completions to the workers, which answered them
	// as a worker does.
	assert.Positive(t, res.FrontendReqPerSec)
	assert.Positive(t, res.FrontendAllocs)

	// Convergence: a crashed worker is dropped within the TTL and a quarter
	// (plus the polling and a loaded machine's slack); a drained one at
	// once.
	assert.Greater(t, res.CrashMin, 0.0)
	assert.Less(t, res.CrashMax, 2.0)
	assert.NotEmpty(t, res.DeadRequestErr)
	assert.Less(t, res.DrainMax, 1000.0)

	var out bytes.Buffer
	printTable(&out, []*result{res})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2)
	assert.True(t, strings.HasPrefix(strings.TrimSpace(lines[1]), "4 "), lines[1])
}

// The simulated workers announce a model card as a real worker does.
func TestMetaIsAModelCard(t *testing.T) {
	c, err := modelcard.Parse(meta)
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	assert.Equal(t, modelcard.Agg, c.Mode)
	assert.NotEmpty(t, c.TextChecksum)
}

func TestConfigChecked(t *testing.T) {
	cfg := tiny()
	cfg.Workers = 3 // fewer than worker 0, one crash, one drain and one more
	_, err := simulate(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string) {})
	assert.ErrorContains(t, err, "need at least")

	var stderr bytes.Buffer
	assert.Equal(t, 2, run([]string{"-workers", "ten"}, io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "not a number of workers")
}

// With JetStream on the nodes, idle watchers receive no announcement: what
// is delivered idle is about one acknowledgement per lease and one consumer
// heartbeat per watcher each period, not leases times watchers.
func TestSimulateTinyJetStream(t *testing.T) {
	cfg := tiny()
	cfg.JetStream = true
	cfg.Heartbeat, cfg.TTL = 0, 0 // the stream's scheduler counts in seconds
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	res, err := simulate(cfg, quiet, func(string) {})
	require.NoError(t, err)
	require.Empty(t, res.Errors)
	assert.Zero(t, res.DiscDeliv)
	assert.Less(t, res.IdleDelivSec, float64(cfg.Workers+res.Watchers)*2)
	assert.Greater(t, res.CrashMin, 0.0)
}
