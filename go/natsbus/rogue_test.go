package natsbus

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"strings"
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

// TestTakeoverRaceWithRogue (review finding, 2026-12-04): when the process
// hosting the embedded server exits, its port is free until a survivor binds
// it again. Another user who keeps trying to bind it gets there first some of
// the time; the survivors then reconnect to that listener (nats.go redials
// the same URL) and present the user's token in their CONNECT line.
func TestTakeoverRaceWithRogue(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	const trials = 10
	won := 0
	for i := 0; i < trials; i++ {
		addr := "127.0.0.1:" + freePort(t)
		url := "nats://" + addr
		host, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
		require.NoError(t, err)
		require.True(t, host.Embedded())
		a, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
		require.NoError(t, err)
		secret, err := readToken("127.0.0.1", addr[len("127.0.0.1:"):])
		require.NoError(t, err)

		stop := make(chan struct{})
		tokens := make(chan string, 16)
		bound := make(chan net.Listener, 1)
		go func() { // the rogue: binds the port the moment it is free
			for {
				select {
				case <-stop:
					bound <- nil
					return
				default:
				}
				if l, err := net.Listen("tcp", addr); err == nil {
					bound <- l
					for {
						c, err := l.Accept()
						if err != nil {
							return
						}
						go func() {
							defer c.Close()
							_, _ = c.Write([]byte(`INFO {"server_id":"rogue","version":"2.10.0","proto":1,"max_payload":1048576,"auth_required":true}` + "\r\n"))
							buf := make([]byte, 4096)
							_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
							n, _ := c.Read(buf)
							tokens <- string(buf[:n])
						}()
					}
				}
			}
		}()
		host.Close()
		time.Sleep(300 * time.Millisecond)
		close(stop)
		l := <-bound
		if l != nil {
			select {
			case line := <-tokens:
				if strings.Contains(line, secret) {
					won++
				}
			case <-time.After(2 * time.Second):
			}
			l.Close()
		}
		a.Close()
	}
	t.Logf("the rogue bound the port and received the user's token in %d of %d takeovers", won, trials)
	assert.Zero(t, won, "the user's token went to a listener that is not the user's server")
}
