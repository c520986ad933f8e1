package natsbus

// The embedded server: starting one in this process, and taking an
// address over when the embedded server there went away.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

const (
	// storeDirPrefix names an embedded server's JetStream directory.
	storeDirPrefix = "dynamo-ctx-js-"
	// jetStreamMaxMemory and jetStreamMaxStore bound the embedded
	// server's JetStream: memory for discovery, no file storage.
	jetStreamMaxMemory = 256 << 20
	jetStreamMaxStore  = 1 << 20
)

// errPortTaken means another process holds the listening port.
var errPortTaken = errors.New("port already in use")

// startServer starts an in-process nats-server listening on host:port
// (port "0" means an ephemeral port) and returns once it accepts clients.
// It returns errPortTaken if the port is bound by someone else.
func startServer(host, port string, auth serverAuth) (*server.Server, error) {
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return nil, fmt.Errorf("invalid port %q", port)
	}
	if p != 0 {
		// Probe the port ourselves: nats-server records a bind failure only
		// in unexported state, and it would report "not ready" only after a
		// full timeout. The probe also tells "taken" (join the holder) from
		// errors such as a host that is not a local address (fail).
		l, err := net.Listen("tcp", net.JoinHostPort(host, port))
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, errPortTaken
			}
			return nil, err
		}
		l.Close()
	} else {
		// nats-server reads 0 as "the default port 4222"; RANDOM_PORT asks
		// the kernel for a free one.
		p = server.RANDOM_PORT
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	// JetStream carries discovery (go/discovery): its streams are in
	// memory, but the server wants a store directory all the same. It is
	// this server's own, removed when it shuts down (shutdown).
	store, err := os.MkdirTemp("", storeDirPrefix)
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(&server.Options{
		// Unique, as nats-server requires within a cluster, and marked as
		// embedded for the takeover decision.
		ServerName: embeddedNamePrefix + hex.EncodeToString(id[:]),
		Host:       host,
		Port:       p,
		// No logger is configured at all (never ConfigureLogger), so the
		// server cannot write to stdout/stderr; NoLog states the intent.
		NoLog: true,
		// Signal handling belongs to the host application.
		NoSigs:     true,
		MaxPayload: maxPayload,
		// Nobody without the user's credentials gets in (credentials.go).
		Authorization: auth.token,
		Username:      auth.user,
		Password:      auth.password,
		JetStream:     true,
		StoreDir:      store,
		// Discovery's stream is a few hundred bytes per instance; a bound
		// keeps a misbehaving client from holding the machine's memory
		// (the server's default is three quarters of it) and no file
		// store is ever used.
		JetStreamMaxMemory: jetStreamMaxMemory,
		JetStreamMaxStore:  jetStreamMaxStore,
	})
	if err != nil {
		_ = os.RemoveAll(store)
		return nil, err
	}
	// Start binds the client port synchronously before returning; if that
	// failed (another process won the race after our probe), Addr is nil.
	srv.Start()
	if srv.Addr() == nil {
		shutdown(srv)
		return nil, errPortTaken
	}
	if !srv.ReadyForConnections(readyTimeout) {
		shutdown(srv)
		return nil, fmt.Errorf("embedded server not ready after %s", readyTimeout)
	}
	return srv, nil
}

func shutdown(srv *server.Server) {
	var store string
	if c := srv.JetStreamConfig(); c != nil {
		// The server keeps its files under <store>/jetstream.
		store = filepath.Dir(c.StoreDir)
	}
	srv.Shutdown()
	srv.WaitForShutdown()
	if strings.HasPrefix(filepath.Base(store), storeDirPrefix) {
		_ = os.RemoveAll(store)
	}
}

// clientURL is the URL clients use to reach srv listening on host, with the
// port the kernel actually assigned.
func clientURL(srv *server.Server, host string) string {
	port := srv.Addr().(*net.TCPAddr).Port
	return "nats://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// fileToken reports whether this Bus's embedded server uses a token from
// the runtime directory's file (not the user's own credentials).
func (b *Bus) fileToken() bool {
	return b.srvAuth.token != "" && b.srvAuth.user == "" && !b.auth.explicit() && !urlHasUser(b.url)
}

// start launches the takeover loop when the address allows it.
func (b *Bus) start() {
	if !b.takeover {
		return
	}
	b.wg.Add(1)
	go b.takeoverLoop()
}

// requestTakeover is called from client callbacks, which must not block.
func (b *Bus) requestTakeover() {
	if !b.takeover {
		return
	}
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// takeoverLoop tries to host the server each time the connection reports a
// disconnect or a failed reconnect. Binding the port decides the race among
// survivors; a loser simply keeps reconnecting, now to the winner.
func (b *Bus) takeoverLoop() {
	defer b.wg.Done()
	for {
		select {
		case <-b.stop:
			return
		case <-b.kick:
		}
		if b.Embedded() || b.nc.IsConnected() || !b.onEmbedded.Load() {
			continue
		}
		srv, err := startServer(b.host, b.port, b.srvAuth)
		if err != nil {
			if !errors.Is(err, errPortTaken) {
				b.log.Warn("could not host replacement NATS server", "url", redact(b.url), "error", err)
			}
			continue
		}
		b.mu.Lock()
		b.srv = srv
		b.mu.Unlock()
		if b.fileToken() {
			// The host that left removed its file: newcomers need it.
			if path, err := replaceToken(b.host, b.port, b.srvAuth.token); err == nil {
				b.tokenFile = path
			}
		}
		b.log.Info("hosting replacement embedded NATS server", "url", redact(b.url))
	}
}

// noteServer records whether nc is connected to an embedded server. Called
// on connect and reconnect; a disconnect leaves the last value in place,
// which is the one the takeover decision needs.
func (b *Bus) noteServer(nc *nats.Conn) {
	if name := nc.ConnectedServerName(); name != "" {
		b.onEmbedded.Store(strings.HasPrefix(name, embeddedNamePrefix))
	}
}
