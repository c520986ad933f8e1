package natsbus

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// Credentials.
//
// The embedded server requires a token. The process that first needs a
// server at an address makes a random 256-bit token and stores it in a file
// only its user can read, in the user's runtime directory:
//
//	$DYNAMO_CTX_RUNTIME_DIR, else $XDG_RUNTIME_DIR/dynamo-ctx, else
//	<temp dir>/dynamo-ctx-<uid> (<cache dir>/dynamo-ctx-run if another
//	user took that name first); the directory mode 0700, the file
//	nats-<host>-<port>-net<inode>.token mode 0600 (see TokenFile).
//
// Every process of that user that connects to the address from the same
// network namespace reads the token from there, so the user's processes
// join (and take over) each other's servers, and other users' processes
// cannot connect: they cannot read the file. Each network namespace has its
// own file, as it has its own loopback address. The other way round, a server of another user that holds the
// address (it bound it first, or while the user's host was being replaced)
// is refused before anything is sent to it, the token included: see
// ownerDialer. A directory or file that others could read or write is refused, not
// used. NATS_TOKEN (or Options.Token) overrides the file on both sides: the
// embedded server then requires that token.
//
// For an external server or cluster, credentials and TLS are given as the
// NATS ecosystem spells them: user and password or token in the URL
// (nats://user:pass@host:4222, nats://token@host:4222), or the environment
// variables of the nats CLI: NATS_USER and NATS_PASSWORD, NATS_TOKEN,
// NATS_CREDS (a creds file: JWT and nkey seed), NATS_NKEY (an nkey seed
// file); tls:// URLs, NATS_CA (CA certificates file), NATS_CERT and NATS_KEY
// (client certificate and key). Options fields of the same names take
// precedence over the environment.

// Environment variables read by Connect for credentials and TLS.
const (
	EnvRuntimeDir = "DYNAMO_CTX_RUNTIME_DIR"
	EnvToken      = "NATS_TOKEN"
	EnvUser       = "NATS_USER"
	EnvPassword   = "NATS_PASSWORD"
	EnvCreds      = "NATS_CREDS"
	EnvNkey       = "NATS_NKEY"
	EnvCA         = "NATS_CA"
	EnvCert       = "NATS_CERT"
	EnvKey        = "NATS_KEY"
)

// Auth holds the credentials and TLS files of a connection. Empty fields
// fall back to the environment variables above.
type Auth struct {
	Token, User, Password string
	CredsFile, NkeyFile   string
	CAFile                string
	CertFile, KeyFile     string
}

func (a Auth) withEnv() Auth {
	env := func(v *string, name string) {
		if *v == "" {
			*v = os.Getenv(name)
		}
	}
	env(&a.Token, EnvToken)
	env(&a.User, EnvUser)
	env(&a.Password, EnvPassword)
	env(&a.CredsFile, EnvCreds)
	env(&a.NkeyFile, EnvNkey)
	env(&a.CAFile, EnvCA)
	env(&a.CertFile, EnvCert)
	env(&a.KeyFile, EnvKey)
	return a
}

// explicit reports whether the user gave credentials of their own (then no
// token file is read).
func (a Auth) explicit() bool {
	return a.Token != "" || a.User != "" || a.CredsFile != "" || a.NkeyFile != ""
}

// options turns a into nats.go options. token is the embedded server's
// token when no explicit credentials are given.
func (a Auth) options(token string) ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case a.CredsFile != "":
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	case a.NkeyFile != "":
		o, err := nats.NkeyOptionFromSeed(a.NkeyFile)
		if err != nil {
			return nil, fmt.Errorf("natsbus: %s: %w", EnvNkey, err)
		}
		opts = append(opts, o)
	case a.User != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token))
	case token != "":
		opts = append(opts, nats.Token(token))
	}
	if a.CAFile != "" {
		opts = append(opts, nats.RootCAs(a.CAFile))
	}
	if a.CertFile != "" || a.KeyFile != "" {
		if a.CertFile == "" || a.KeyFile == "" {
			return nil, fmt.Errorf("natsbus: %s and %s go together", EnvCert, EnvKey)
		}
		opts = append(opts, nats.ClientCert(a.CertFile, a.KeyFile))
	}
	return opts, nil
}

// ClientAuth returns the nats.go options with which another connection (a
// tool, a test) authenticates to the server at url the way Connect would:
// the environment's credentials, else the token file of an embedded server
// at that address.
func ClientAuth(url string) ([]nats.Option, error) {
	a := Auth{}.withEnv()
	token := ""
	if host, port, single := splitAddr(url); single && !a.explicit() {
		t, err := readToken(host, port)
		if err != nil {
			return nil, err
		}
		token = t
	}
	return a.options(token)
}

// RuntimeDir returns the directory of the token files, creating it (mode
// 0700) if needed. It refuses a directory that is not the user's own or
// that others may read or write.
//
// Without DYNAMO_CTX_RUNTIME_DIR and XDG_RUNTIME_DIR it is
// <temp dir>/dynamo-ctx-<uid>, a name another user can take first in a
// shared temp dir; when that name is another user's, the user's cache
// directory is used instead (<cache dir>/dynamo-ctx-run), which every
// process of the user then finds the same way.
func RuntimeDir() (string, error) {
	if d := os.Getenv(EnvRuntimeDir); d != "" {
		return privateDir(d)
	}
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" {
		return privateDir(filepath.Join(x, "dynamo-ctx"))
	}
	d := filepath.Join(os.TempDir(), fmt.Sprintf("dynamo-ctx-%d", os.Getuid()))
	got, err := privateDir(d)
	if !errors.Is(err, errNotOurs) {
		return got, err
	}
	cache, cerr := os.UserCacheDir()
	if cerr != nil {
		return "", fmt.Errorf("%w; and no cache directory to use instead (%v): set %s", err, cerr, EnvRuntimeDir)
	}
	return privateDir(filepath.Join(cache, "dynamo-ctx-run"))
}

// privateDir creates d (mode 0700) if needed and checks it is private.
func privateDir(d string) (string, error) {
	if err := os.MkdirAll(d, 0o700); err != nil {
		if perr := private(d, true); errors.Is(perr, errNotOurs) {
			return "", perr // another user's file or link where the directory goes
		}
		return "", fmt.Errorf("natsbus: runtime directory: %w", err)
	}
	if err := private(d, true); err != nil {
		return "", err
	}
	return d, nil
}

// errNotOurs: the path is another user's (or a link another user made).
var errNotOurs = errors.New("not the user's own")

// private checks that path is the user's own and closed to others.
func private(path string, dir bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("natsbus: %s belongs to another user: %w", path, errNotOurs)
	}
	if fi.Mode()&fs.ModeSymlink != 0 || fi.IsDir() != dir {
		return fmt.Errorf("natsbus: %s is not a plain %s", path, map[bool]string{true: "directory", false: "file"}[dir])
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("natsbus: %s is open to other users (mode %v); it must be private (0700 for the directory, 0600 for token files)", path, fi.Mode().Perm())
	}
	return nil
}

// TokenFile is the path of the token file of the embedded server at
// host:port, as seen from this process's network namespace:
// nats-<host>-<port>-net<inode>.token on Linux (the inode of
// /proc/self/ns/net), nats-<host>-<port>.token where there are no network
// namespaces. Two namespaces of one user each have their own 127.0.0.1:4222,
// served by different servers with different tokens, so each has its own
// file: one namespace's stack never reads, replaces or removes another's.
func TokenFile(host, port string) (string, error) {
	d, err := RuntimeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, tokenName(host, port, netNamespace())), nil
}

// tokenName is the name of the token file of host:port in the network
// namespace ns ("" where there are none).
func tokenName(host, port, ns string) string {
	safe := strings.Map(func(r rune) rune {
		if r == '.' || r == '-' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, host)
	name := "nats-" + safe + "-" + port
	if ns != "" {
		name += "-net" + ns
	}
	return name + ".token"
}

// netNamespace identifies this process's network namespace: the inode
// number of /proc/self/ns/net (the link reads "net:[4026531840]"), or ""
// where there is no such link (outside Linux).
func netNamespace() string {
	l, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return ""
	}
	ino, ok := strings.CutPrefix(l, "net:[")
	if ino, ok = strings.CutSuffix(ino, "]"); !ok || !allDigits(ino) {
		return ""
	}
	return ino
}

func allDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// readToken returns the token stored for host:port, or "" if there is none.
func readToken(host, port string) (string, error) {
	p, err := TokenFile(host, port)
	if err != nil {
		return "", err
	}
	return readTokenFile(p)
}

// readTokenFile returns the token in the file at p, or "" if there is none.
func readTokenFile(p string) (string, error) {
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("natsbus: token file: %w", err)
	}
	if err := private(p, false); err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// sharedToken returns the token for host:port, creating it if there is
// none. Creation is atomic (a hard link that fails if the file exists), so
// processes racing to host a server all end up with the same token.
func sharedToken(host, port string) (string, error) {
	p, err := TokenFile(host, port)
	if err != nil {
		return "", err
	}
	if t, err := readTokenFile(p); err != nil || t != "" {
		return t, err
	}
	tmp, err := tempToken(p, newSecret())
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, p); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("natsbus: token file: %w", err)
	}
	return readTokenFile(p) // ours, or that of the process that won the race
}

// replaceToken stores tok as the token of host:port (this process hosts the
// server there now) and returns the file's path.
func replaceToken(host, port, tok string) (string, error) {
	p, err := TokenFile(host, port)
	if err != nil {
		return "", err
	}
	tmp, err := tempToken(p, tok)
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	if err := os.Rename(tmp, p); err != nil {
		return "", fmt.Errorf("natsbus: token file: %w", err)
	}
	return p, nil
}

// tempToken writes tok to a new private file beside p and returns its path.
func tempToken(p, tok string) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(p), ".token-*")
	if err != nil {
		return "", fmt.Errorf("natsbus: token file: %w", err)
	}
	tmp := f.Name()
	_, err = f.WriteString(tok + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o600)
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("natsbus: token file: %w", err)
	}
	return tmp, nil
}

// removeToken removes the token file p if it still holds tok (a host
// leaving: a process that takes over its address writes it again). p is the
// path the host wrote, in its own namespace.
func removeToken(p, tok string) {
	if t, err := readTokenFile(p); err == nil && t == tok {
		_ = os.Remove(p)
	}
}

// staleAfter is how old a token file must be before a sweep may remove it:
// a host writes its file just before its server listens.
const staleAfter = time.Minute

// maxSweep bounds the addresses one sweep dials.
const maxSweep = 1024

// sweepStaleTokens removes the token files, older than staleAfter, of
// embedded servers whose address no longer accepts connections (their host
// exited without removing the file: it was killed). A host starting its
// server calls it, so the runtime directory holds the live servers' files.
// Only the files of this network namespace are looked at: an address is
// dialled where it was served, and another namespace's server, which this
// process cannot reach, keeps its file.
func sweepStaleTokens() {
	d, err := RuntimeDir()
	if err != nil {
		return
	}
	entries, err := os.ReadDir(d)
	if err != nil {
		return
	}
	ours := netNamespace()
	seen := 0
	for _, e := range entries {
		host, port, ns, ok := tokenAddr(e.Name())
		if !ok || ns != ours {
			continue
		}
		if seen++; seen > maxSweep {
			return
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < staleAfter {
			continue
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 200*time.Millisecond)
		if err == nil {
			conn.Close()
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			_ = os.Remove(filepath.Join(d, e.Name()))
		}
	}
}

// tokenAddr reads the address and namespace back from a token file's name
// (tokenName), for the hosts a name keeps whole: IPv4 addresses and names.
func tokenAddr(name string) (host, port, ns string, ok bool) {
	rest, ok := strings.CutPrefix(name, "nats-")
	if !ok {
		return "", "", "", false
	}
	if rest, ok = strings.CutSuffix(rest, ".token"); !ok {
		return "", "", "", false
	}
	if i := strings.LastIndex(rest, "-net"); i > 0 && allDigits(rest[i+4:]) {
		rest, ns = rest[:i], rest[i+4:]
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return "", "", "", false
	}
	host, port = rest[:i], rest[i+1:]
	if !allDigits(port) || strings.ContainsRune(host, '_') {
		return "", "", "", false
	}
	return host, port, ns, true
}

func newSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (Go >= 1.24)
	return hex.EncodeToString(b[:])
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
