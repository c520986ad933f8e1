package natsbus

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// capture is a rogue server's authentication hook: it lets everyone in and
// keeps the tokens clients present.
type capture struct {
	mu     sync.Mutex
	tokens []string
}

func (c *capture) Check(ca server.ClientAuthentication) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tokens = append(c.tokens, ca.GetOpts().Token)
	return true
}

// TestRogueServerOnEmbeddableAddress (review finding, 2026-12-04): the
// embeddable address (nats://127.0.0.1:4222 by default; here a free port
// with EmbedIfAbsent, the same code path) is dialed first, and whatever
// NATS server answers there is joined. Another user on the machine who binds
// it first with an open nats-server (or binds it when the user's embedded
// host exits, before a survivor takes it over) gets every runtime of the
// user on its bus: it reads the request envelopes (prompts, stream tokens,
// so it can attach to the callers' stream ports and answer in the workers'
// place) and it is handed the user's token from the private token file in
// the CONNECT line. Nothing checks that the server is the user's own.
func TestRogueServerOnEmbeddableAddress(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	hook := &capture{}
	rogue, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		CustomClientAuthentication: hook})
	require.NoError(t, err)
	rogue.Start()
	t.Cleanup(func() { shutdown(rogue) })
	require.True(t, rogue.ReadyForConnections(5*time.Second))
	port := strconv.Itoa(rogue.Addr().(*net.TCPAddr).Port)
	url := "nats://127.0.0.1:" + port

	// A fresh user (no token file yet), then one whose earlier embedded
	// server left its token file for this address.
	for _, earlier := range []bool{false, true} {
		secret := ""
		if earlier {
			secret, err = sharedToken("127.0.0.1", port)
			require.NoError(t, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		b, err := Connect(ctx, Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
		cancel()
		if err == nil {
			assert.Failf(t, "joined a server that is not the user's own", "token file present: %v; embedded here: %v", earlier, b.Embedded())
			b.Close()
		}
		if earlier {
			hook.mu.Lock()
			assert.NotContains(t, hook.tokens, secret, "the user's token was sent to the rogue server")
			hook.mu.Unlock()
		}
	}
}
