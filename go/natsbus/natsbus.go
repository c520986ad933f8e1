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
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	// tokenHost, tokenPort: the address whose token file this process's
	// embedded server wrote or took over, removed when it leaves (Close).
	tokenHost, tokenPort string
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
		// Ephemeral: nothing to join, always embed.
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
			if _, err := writeToken(host, port, b.srvAuth.token, true); err != nil {
				shutdown(srv)
				return nil, err
			}
			b.tokenHost, b.tokenPort = host, port
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
		return nil, fmt.Errorf("natsbus: the NATS server at %s refused our credentials (%s): %w", redact(raw), b.credentialsHint(), err)
	}
	if err == nil || !embeddable {
		if err != nil {
			return nil, err
		}
		b.start()
		return b, nil
	}

	for attempt := 0; ; attempt++ {
		// Every process racing to host agrees on one token first.
		if err := b.loadServerAuth(); err != nil {
			return nil, err
		}
		if b.srvAuth.empty() {
			tok, err := sharedToken(host, port)
			if err != nil {
				return nil, err
			}
			b.srvAuth.token = tok
		}
		srv, serr := startServer(host, port, b.srvAuth)
		if serr == nil {
			if err = b.dial(name); err != nil {
				shutdown(srv)
				return nil, err
			}
			b.srv = srv
			b.log.Debug("hosting embedded NATS server", "url", redact(b.url))
			if b.fileToken() {
				b.tokenHost, b.tokenPort = host, port
				sweepStaleTokens()
			}
			break
		}
		if !errors.Is(serr, errPortTaken) {
			return nil, fmt.Errorf("natsbus: nothing answers at %s and embedding a server there failed: %w", redact(raw), serr)
		}
		// Another process holds the port: one that won a race with us, or
		// one still starting that did not answer our first dial. Join it;
		// the retries give a starting server time to answer. (A first dial
		// that timed out met a silent holder: see below.)
		if attempt == 0 && isTimeout(err) {
			return nil, fmt.Errorf("natsbus: %s is bound by another process that does not answer as a NATS server; stop it, or set %s to another address: %w", redact(raw), EnvURL, err)
		}
		if err = b.dialSingle(name); err == nil {
			break
		}
		if b.foreign.Load() >= 0 {
			return nil, b.foreignErr(raw)
		}
		if errors.Is(err, nats.ErrAuthorization) {
			return nil, fmt.Errorf("natsbus: the NATS server at %s refused our credentials (%s): %w", redact(raw), b.credentialsHint(), err)
		}
		// A holder that accepted the connection but said nothing within
		// the connect timeout is not a NATS server starting up (one
		// answers within milliseconds of binding): fail now, with a hint.
		if attempt+1 >= embedAttempts || isTimeout(err) {
			return nil, fmt.Errorf("natsbus: %s is bound by another process that does not answer as a NATS server; stop it, or set %s to another address: %w", redact(raw), EnvURL, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("natsbus: connect %s: %w", redact(raw), ctx.Err())
		case <-time.After(time.Duration(attempt+1) * 50 * time.Millisecond):
		}
	}
	b.start()
	return b, nil
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

// serverAuth is what an embedded server requires: a token, or a user and
// password.
type serverAuth struct{ token, user, password string }

func (a serverAuth) empty() bool { return a.token == "" && a.user == "" }

// loadServerAuth decides the credentials of a single address: the user's
// own (NATS_TOKEN, NATS_USER/NATS_PASSWORD) when given, else the token file
// of an embedded server there, if any.
func (b *Bus) loadServerAuth() error {
	switch {
	case b.auth.User != "":
		b.srvAuth = serverAuth{user: b.auth.User, password: b.auth.Password}
	case b.auth.Token != "":
		b.srvAuth = serverAuth{token: b.auth.Token}
	case b.auth.explicit(), !b.takeover, urlHasUser(b.url):
		// The user's own credentials (nats.go reads those of the URL), or
		// an address that can only be an external server: no token file.
		b.srvAuth = serverAuth{}
	default:
		tok, err := readToken(b.host, b.port)
		if err != nil {
			return err
		}
		b.srvAuth = serverAuth{token: tok}
	}
	return nil
}

func (b *Bus) credentialsHint() string {
	if b.auth.explicit() || urlHasUser(b.url) {
		return "the credentials given by NATS_* variables or the URL"
	}
	if b.srvAuth.token != "" {
		p, _ := TokenFile(b.host, b.port)
		return "the token in " + p + "; is the server another user's, or was the file replaced?"
	}
	return "none were given: put them in the URL or set NATS_USER and NATS_PASSWORD, NATS_TOKEN, NATS_CREDS or NATS_NKEY"
}

// urlHasUser reports whether a server URL carries credentials (user,
// user:password or a token) in its user part.
func urlHasUser(raw string) bool {
	for _, one := range strings.Split(raw, ",") {
		if u, err := url.Parse(strings.TrimSpace(one)); err == nil && u.User != nil {
			return true
		}
	}
	return false
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, nats.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout())
}

func envEmbed() bool {
	v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvEmbed)))
	return v == "1" || v == "true" || v == "yes"
}

// OnReconnect registers f to run (on a client callback goroutine; it must
// not block for long) after each reconnection, once subscriptions are
// restored.
func (b *Bus) OnReconnect(f func()) {
	b.mu.Lock()
	b.onReconnect = append(b.onReconnect, f)
	b.mu.Unlock()
}

type sessionCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newSession() *sessionCtx {
	ctx, cancel := context.WithCancel(context.Background())
	return &sessionCtx{ctx, cancel}
}

// Session is a context cancelled when the connection next goes down. A
// request/reply waiting under it ends at once when the server it was sent
// to dies (the message may have died with it) instead of running into its
// timeout; the caller sends it again once connected.
func (b *Bus) Session() context.Context { return b.session.Load().ctx }

// Settling reports whether the connection is down, or came back less than
// SettleWindow ago (see the package documentation).
func (b *Bus) Settling() bool {
	if b.down.Load() {
		return true
	}
	last := b.lastChange.Load()
	return last != 0 && time.Since(time.Unix(0, last)) < SettleWindow
}

// WaitConnected returns nil once the connection is up (at once if it is),
// or ctx's error; ErrClosed-like errors come from the client library once
// the Bus is closed.
func (b *Bus) WaitConnected(ctx context.Context) error {
	for !b.nc.IsConnected() {
		if b.nc.IsClosed() {
			return nats.ErrConnectionClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// Conn returns the underlying connection. It stays valid (and reconnects by
// itself) until Close; callers must not close it themselves.
func (b *Bus) Conn() *nats.Conn { return b.nc }

// URL returns the address the Bus connected to; for an ephemeral embedded
// server it carries the actual port, so other clients can be pointed at it.
func (b *Bus) URL() string { return b.url }

// Embedded reports whether this process currently hosts the server, either
// since Connect or after a takeover.
func (b *Bus) Embedded() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.srv != nil
}

// Close drains the connection (pending publishes are sent, handlers of
// messages already received finish), closes it, then shuts down the
// embedded server if this process hosts it and waits for that shutdown.
// Clients of other processes lose the server at that point; embeddable ones
// take over. Close is idempotent and safe to call concurrently.
func (b *Bus) Close() {
	b.closeOnce.Do(func() {
		// Stop the takeover loop first: closing the connection fires the
		// disconnect handler, which must not start a new server.
		close(b.stop)
		b.wg.Wait()
		if err := b.nc.Drain(); err != nil {
			b.nc.Close()
		}
		select {
		case <-b.closed:
		case <-time.After(drainTimeout + time.Second):
			// Drain is bounded by DrainTimeout; this is a safety net.
			b.nc.Close()
			<-b.closed
		}
		b.mu.Lock()
		srv := b.srv
		b.srv = nil
		b.mu.Unlock()
		if srv != nil {
			// Before the server goes: a process that takes the address
			// over writes the file again (takeoverLoop).
			if b.tokenPort != "" {
				removeToken(b.tokenHost, b.tokenPort, b.srvAuth.token)
			}
			shutdown(srv)
		}
	})
}

// fileToken reports whether this Bus's embedded server uses a token from
// the runtime directory's file (not the user's own credentials).
func (b *Bus) fileToken() bool {
	return b.srvAuth.token != "" && b.srvAuth.user == "" && !b.auth.explicit() && !urlHasUser(b.url)
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
	if b.pin {
		authOpts = append(authOpts, nats.SetCustomDialer(ownerDialer{
			timeout: connectTimeout,
			refused: func(uid int) {
				if b.foreign.Swap(int64(uid)) != int64(uid) {
					b.log.Error("refused a NATS server of another user: it is sent neither our token nor any request", "url", redact(b.url), "uid", uid)
				}
			},
		}))
	}
	nc, err := nats.Connect(b.url, append(authOpts,
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

// noteServer records whether nc is connected to an embedded server. Called
// on connect and reconnect; a disconnect leaves the last value in place,
// which is the one the takeover decision needs.
func (b *Bus) noteServer(nc *nats.Conn) {
	if name := nc.ConnectedServerName(); name != "" {
		b.onEmbedded.Store(strings.HasPrefix(name, embeddedNamePrefix))
	}
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
			if _, err := writeToken(b.host, b.port, b.srvAuth.token, true); err == nil {
				b.tokenHost, b.tokenPort = b.host, b.port
			}
		}
		b.log.Info("hosting replacement embedded NATS server", "url", redact(b.url))
	}
}

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
	})
	if err != nil {
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
	srv.Shutdown()
	srv.WaitForShutdown()
}

// clientURL is the URL clients use to reach srv listening on host, with the
// port the kernel actually assigned.
func clientURL(srv *server.Server, host string) string {
	port := srv.Addr().(*net.TCPAddr).Port
	return "nats://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// splitAddr returns the host and port of a single-server URL, and false for
// a server list or an address it cannot parse (which is then only dialed).
func splitAddr(raw string) (host, port string, ok bool) {
	if strings.Contains(raw, ",") {
		return "", "", false
	}
	s := raw
	if !strings.Contains(s, "://") {
		s = "nats://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "nats" || u.Hostname() == "" {
		return "", "", false
	}
	port = u.Port()
	if port == "" {
		port = "4222"
	}
	return u.Hostname(), port, true
}

// isDefault reports whether host:port is DefaultURL's address.
func isDefault(host, port string) bool {
	dh, dp, _ := splitAddr(DefaultURL)
	return host == dh && port == dp
}

// redact hides credentials embedded in a URL before it appears in an error.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}
