// Package natsbus connects a process to the NATS server that carries the
// runtime's discovery and request traffic, hosting that server in-process
// when none is running, so that a single machine needs nothing installed.
//
// Address. Connect uses Options.URL if set, else the NATS_SERVER environment
// variable, else DefaultURL (nats://127.0.0.1:4222). A comma-separated list
// of URLs is passed to the client as a server pool and is never embedded.
// DYNAMO_CTX_EMBED_NATS=1 in the environment sets Options.EmbedIfAbsent, so a
// deployment (or a test) can have its own embedded server on another port.
//
// Connect guarantees:
//
//   - Joining: if a NATS server answers at the address, the Bus is a client
//     of it and Embedded reports false.
//   - Embedding: if nothing answers and the address is embeddable (it is
//     DefaultURL, or Options.EmbedIfAbsent is set), Connect starts a
//     nats-server in this process listening on that host and port, waits
//     until it accepts clients, and connects to it; Embedded then reports
//     true. Other processes on the machine that Connect to the same address
//     join that server. Any other address that does not answer is an error,
//     returned as soon as the connection attempt fails, because a server the
//     user named explicitly must not be silently replaced by a local one.
//   - One server per address: when several processes find the address empty
//     at once, exactly one binds the port; the others observe that the port
//     is taken and join the winner (retried a few times while the winner
//     comes up). They never end up on separate servers.
//   - Ephemeral: an address whose port is 0 (for example
//     "nats://127.0.0.1:0") always starts an embedded server on a free port
//     chosen by the kernel; URL reports the actual port. Meant for tests,
//     which must not compete for 4222.
//   - Takeover: while a Bus with a single address is disconnected from an
//     embedded server (typically because the process hosting it exited), it
//     tries to host a server on that address itself; the survivors race as
//     above, one wins, and every client's automatic reconnect lands on it,
//     typically within 100-300 ms. Subscriptions are restored by the client
//     library, and OnReconnect hooks run (discovery re-announces instances).
//     A Bus that was on a standalone nats-server never takes over, so that
//     server finds its port free when it restarts; embedded servers are told
//     apart by their server name. This includes an ephemeral server's actual
//     address, which other processes were given (not the host itself: its
//     server dies with it).
//   - Settling: Settling reports whether the connection is down or came
//     back within SettleWindow, so that a caller can treat "no responders"
//     in that window as the workers not having re-subscribed yet;
//     WaitConnected waits for the connection to come back.
//   - Silence: the embedded server never writes to stdout or stderr (it runs
//     with no logger and without signal handlers, which belong to the host
//     application). Client-side events (disconnect, reconnect, asynchronous
//     errors) are reported through log/slog only.
//
// A Bus's connection reconnects forever with short waits, so a restart of
// the server is ridden out rather than surfaced as an error.
package natsbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// DefaultURL is the address used when neither Options.URL nor the
// NATS_SERVER environment variable names one. It is always embeddable.
const DefaultURL = "nats://127.0.0.1:4222"

// EnvURL is the environment variable consulted when Options.URL is empty.
const EnvURL = "NATS_SERVER"

// EnvEmbed, set to "1" or "true", makes a single non-default address
// embeddable, like Options.EmbedIfAbsent.
const EnvEmbed = "DYNAMO_CTX_EMBED_NATS"

// SettleWindow is how long after a reconnection Settling stays true: the
// time other processes may need to reconnect and re-subscribe.
const SettleWindow = 2 * time.Second

// DefaultName is the client name reported to the server when Options.Name
// is empty.
const DefaultName = "dynamo-ctx"

const (
	// embedAttempts bounds how often Connect alternates between "start a
	// server" and "join the one that beat us to the port" before giving up.
	embedAttempts = 5
	// readyTimeout bounds how long an embedded server may take to accept
	// clients after binding its port; it is generous because a loaded CI
	// machine can be slow, and it is only spent on a broken start.
	readyTimeout = 5 * time.Second
	// connectTimeout bounds one connection attempt (TCP dial plus the NATS
	// handshake). A local "connection refused" returns at once regardless.
	connectTimeout = 2 * time.Second
	// reconnectWait is short because the common cause of a disconnect here
	// is a local server being replaced, which takes milliseconds.
	reconnectWait = 100 * time.Millisecond
	// drainTimeout bounds Close when the server is unreachable.
	drainTimeout = 2 * time.Second
	// maxPayload raises the embedded server's 1 MiB default: a request that
	// carries a long prompt as token ids can exceed it. 8 MiB is the largest
	// value nats-server accepts without warning.
	maxPayload = 8 << 20
	// embeddedNamePrefix starts the server name of every embedded server;
	// clients read it to know whether the server they lose is one they may
	// replace.
	embeddedNamePrefix = "dynamo-ctx-embedded-"
)

// Options configures Connect. The zero value connects to the default address,
// embedding a server there if none answers.
type Options struct {
	// URL is the server address, or a comma-separated list of addresses.
	// Empty means the NATS_SERVER environment variable, else DefaultURL.
	// A port of 0 means "embed on an ephemeral port".
	URL string
	// EmbedIfAbsent makes a single non-default URL embeddable: if nothing
	// answers there, a server is started on its host and port. DefaultURL
	// is embeddable regardless.
	EmbedIfAbsent bool
	// Name is the client connection name shown by server monitoring.
	// Empty means DefaultName.
	Name string
	// Logger receives connection events. Nil means slog.Default().
	Logger *slog.Logger
	// Auth holds credentials and TLS files; empty fields fall back to the
	// environment (see credentials.go). Without explicit credentials, the
	// token file of an embedded server at the address is used.
	Auth Auth
}

// Bus is a connection to the request-plane NATS server, plus the embedded
// server when this process hosts it. Its methods may be called concurrently.
type Bus struct {
	nc      *nats.Conn
	url     string
	log     *slog.Logger
	closed  chan struct{} // closed by the client's ClosedHandler
	auth    Auth          // with the environment applied
	srvAuth serverAuth    // what an embedded server of ours requires (and we present)

	// takeover is set for embeddable, non-ephemeral addresses; host and port
	// are where a replacement server would listen.
	takeover   bool
	host, port string
	// tokenFile: the token file this process's embedded server wrote or
	// took over, removed when it leaves (Close).
	tokenFile string
	// pin: the address is on loopback and reached without explicit
	// credentials, so only a server of this user is joined (ownerDialer);
	// foreign is the uid of the last other user's server refused (-1: none).
	pin        bool
	foreign    atomic.Int64
	kick       chan struct{} // buffered(1): "we are disconnected, try to host"
	onEmbedded atomic.Bool   // the server last connected to was embedded
	stop       chan struct{} // closed by Close to end the takeover loop
	wg         sync.WaitGroup

	mu          sync.Mutex
	srv         *server.Server // non-nil while this process hosts the server
	onReconnect []func()

	// lastChange is when the connection last went down or came back (unix
	// nanoseconds); down is set while it is down.
	lastChange atomic.Int64
	down       atomic.Bool
	// session is cancelled when the connection next goes down (then
	// replaced): a request in flight at that moment may have been lost
	// with the old server, see Session.
	session atomic.Pointer[sessionCtx]

	closeOnce sync.Once
}

// Connect connects to the request-plane NATS server as described in the
// package documentation. ctx bounds only the connection phase (including
// the retries of a lost embedding race); the Bus lives until Close.
func Connect(ctx context.Context, opts Options) (*Bus, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("natsbus: connect: %w", err)
	}
	raw := opts.URL
	if raw == "" {
		raw = os.Getenv(EnvURL)
	}
	if raw == "" {
		raw = DefaultURL
	}
	b := &Bus{
		url:    raw,
		log:    opts.Logger,
		closed: make(chan struct{}),
		kick:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	b.session.Store(newSession())
	if b.log == nil {
		b.log = slog.Default()
	}
	b.log = b.log.With("component", "natsbus")
	name := opts.Name
	if name == "" {
		name = DefaultName
	}

	b.auth = opts.Auth.withEnv()
	host, port, single := splitAddr(raw)
	b.pin = single && isLoopback(host) && !b.auth.explicit() && !urlHasUser(raw)
	b.foreign.Store(-1)
	if single && port == "0" {
		return b.connectEphemeral(raw, host, name)
	}

	embeddable := single && (opts.EmbedIfAbsent || envEmbed() || isDefault(host, port))
	// Set before the first dial: the client's callbacks read these. Any
	// single address may be taken over (only ever when the server lost was
	// an embedded one: see takeoverLoop).
	b.takeover, b.host, b.port = single, host, port
	err := b.dialSingle(name)
	if err != nil && b.foreign.Load() >= 0 {
		return nil, b.foreignErr(raw)
	}
	if errors.Is(err, nats.ErrAuthorization) {
		return nil, b.refusedErr(raw, err)
	}
	if err == nil || !embeddable {
		if err != nil {
			return nil, err
		}
		b.start()
		return b, nil
	}
	if err := b.embedOrJoin(ctx, raw, name, err); err != nil {
		return nil, err
	}
	b.start()
	return b, nil
}

// connectEphemeral is Connect to an address whose port is 0: nothing to
// join, always embed (on a port the kernel chooses).
func (b *Bus) connectEphemeral(raw, host, name string) (*Bus, error) {
	b.srvAuth = serverAuth{token: b.auth.Token, user: b.auth.User, password: b.auth.Password}
	if b.srvAuth.empty() {
		b.srvAuth.token = newSecret()
	}
	srv, err := startServer(host, "0", b.srvAuth)
	if err != nil {
		return nil, fmt.Errorf("natsbus: start embedded server on %s: %w", redact(raw), err)
	}
	b.url = clientURL(srv, host)
	if b.auth.Token == "" && b.auth.User == "" {
		// The port is new: the file is ours to (over)write, and to
		// remove when we leave (Close).
		_, port, _ := splitAddr(b.url)
		path, err := replaceToken(host, port, b.srvAuth.token)
		if err != nil {
			shutdown(srv)
			return nil, err
		}
		b.tokenFile = path
		sweepStaleTokens()
	}
	if err := b.dial(name); err != nil {
		shutdown(srv)
		return nil, err
	}
	b.srv = srv
	b.start()
	return b, nil
}

// embedOrJoin is Connect to an embeddable address where nothing answered
// (err: the first dial's error): it hosts a server there, or joins the
// process that beat it to the port, retrying while that one comes up.
func (b *Bus) embedOrJoin(ctx context.Context, raw, name string, err error) error {
	for attempt := 0; ; attempt++ {
		// Every process racing to host agrees on one token first.
		if err := b.loadServerAuth(); err != nil {
			return err
		}
		if b.srvAuth.empty() {
			tok, err := sharedToken(b.host, b.port)
			if err != nil {
				return err
			}
			b.srvAuth.token = tok
		}
		srv, serr := startServer(b.host, b.port, b.srvAuth)
		if serr == nil {
			if err = b.dial(name); err != nil {
				shutdown(srv)
				return err
			}
			b.srv = srv
			b.log.Debug("hosting embedded NATS server", "url", redact(b.url))
			if b.fileToken() {
				if p, err := TokenFile(b.host, b.port); err == nil {
					b.tokenFile = p
				}
				sweepStaleTokens()
			}
			return nil
		}
		if !errors.Is(serr, errPortTaken) {
			return fmt.Errorf("natsbus: nothing answers at %s and embedding a server there failed: %w", redact(raw), serr)
		}
		// Another process holds the port: one that won a race with us, or
		// one still starting that did not answer our first dial. Join it;
		// the retries give a starting server time to answer. (A first dial
		// that timed out met a silent holder: see below.)
		if attempt == 0 && isTimeout(err) {
			return b.silentHolderErr(raw, err)
		}
		if err = b.dialSingle(name); err == nil {
			return nil
		}
		if b.foreign.Load() >= 0 {
			return b.foreignErr(raw)
		}
		if errors.Is(err, nats.ErrAuthorization) {
			return b.refusedErr(raw, err)
		}
		// A holder that accepted the connection but said nothing within
		// the connect timeout is not a NATS server starting up (one
		// answers within milliseconds of binding): fail now, with a hint.
		if attempt+1 >= embedAttempts || isTimeout(err) {
			return b.silentHolderErr(raw, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsbus: connect %s: %w", redact(raw), ctx.Err())
		case <-time.After(time.Duration(attempt+1) * 50 * time.Millisecond):
		}
	}
}

// refusedErr is Connect's error when the server at raw refused the
// credentials.
func (b *Bus) refusedErr(raw string, err error) error {
	return fmt.Errorf("natsbus: the NATS server at %s refused our credentials (%s): %w", redact(raw), b.credentialsHint(), err)
}

// silentHolderErr is Connect's error when the port of raw is held by a
// process that does not answer as a NATS server.
func (b *Bus) silentHolderErr(raw string, err error) error {
	return fmt.Errorf("natsbus: %s is bound by another process that does not answer as a NATS server; stop it, or set %s to another address: %w", redact(raw), EnvURL, err)
}

// foreignErr is Connect's error when the server at raw runs as another user.
func (b *Bus) foreignErr(raw string) error {
	return fmt.Errorf("natsbus: %s is served by a process of another user (uid %d), which got there first; "+
		"it was sent neither the token nor any request. Stop it, or set %s to another address: %w",
		redact(raw), b.foreign.Load(), EnvURL, ErrForeignServer)
}

// dialSingle dials a single address with the credentials of loadServerAuth.
// A refusal is retried with the token file read again, for a short while:
// a process that won a race to host the server may have written the file
// just after we looked.
func (b *Bus) dialSingle(name string) error {
	var err error
	for i := 0; i < 5; i++ {
		if err = b.loadServerAuth(); err != nil {
			return err
		}
		if err = b.dial(name); !errors.Is(err, nats.ErrAuthorization) || b.auth.explicit() || !b.takeover || urlHasUser(b.url) {
			return err
		}
		time.Sleep(time.Duration(i+1) * 20 * time.Millisecond)
	}
	return err
}

func envEmbed() bool {
	v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvEmbed)))
	return v == "1" || v == "true" || v == "yes"
}

// dial connects b.nc to b.url with the Bus's client options. The first
// attempt is not retried: a refused connection is reported at once, which is
// how Connect learns that nothing answers.
func (b *Bus) dial(name string) error {
	token := b.srvAuth.token
	if b.srvAuth.user != "" {
		token = ""
	}
	authOpts, err := b.auth.options(token)
	if err != nil {
		return err
	}
	dialer := nats.SetCustomDialer(rawDialer{timeout: connectTimeout})
	if b.pin {
		dialer = nats.SetCustomDialer(ownerDialer{
			timeout: connectTimeout,
			refused: func(uid int) {
				if b.foreign.Swap(int64(uid)) != int64(uid) {
					b.log.Error("refused a NATS server of another user: it is sent neither our token nor any request", "url", redact(b.url), "uid", uid)
				}
			},
		})
	}
	nc, err := nats.Connect(b.url, append(authOpts, dialer,
		nats.Name(name),
		nats.Timeout(connectTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectJitter(reconnectWait/2, reconnectWait/2),
		nats.DrainTimeout(drainTimeout),
		// Requests sent while reconnecting wait in the client's buffer and
		// leave as soon as it is back (the default, stated).
		nats.ReconnectBufSize(8<<20),
		// A server that vanished without a reset (partition, stopped host) is
		// noticed within ~15 s instead of nats.go's default 4 minutes, and
		// the client moves to another member of the pool.
		nats.PingInterval(5*time.Second),
		nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			b.down.Store(true)
			b.lastChange.Store(time.Now().UnixNano())
			b.session.Swap(newSession()).cancel()
			if err != nil {
				b.log.Warn("NATS connection lost", "url", redact(b.url), "error", err)
			}
			b.requestTakeover()
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			b.log.Debug("NATS reconnect attempt failed", "url", redact(b.url), "error", err)
			b.requestTakeover()
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			b.lastChange.Store(time.Now().UnixNano())
			b.down.Store(false)
			b.noteServer(nc)
			b.log.Info("NATS connection restored", "url", nc.ConnectedUrlRedacted())
			b.mu.Lock()
			hooks := append([]func(){}, b.onReconnect...)
			b.mu.Unlock()
			for _, f := range hooks {
				f()
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			b.log.Error("NATS asynchronous error", "subject", subj, "error", err)
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(b.closed) }),
	)...)
	if err != nil {
		return fmt.Errorf("natsbus: connect %s: %w", redact(b.url), err)
	}
	b.nc = nc
	b.noteServer(nc)
	return nil
}
