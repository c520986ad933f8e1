package natsbus

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The embedded server requires the token its host wrote to the user's
// runtime directory: a client without it is refused; the user's other
// processes read it and join.
func TestEmbeddedServerRequiresToken(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	host := connect(t, Options{URL: "nats://127.0.0.1:0"})
	_, port, _ := splitAddr(host.URL())
	path, err := TokenFile("127.0.0.1", port)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	di, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), di.Mode().Perm())

	// A stranger (no token, a wrong token) cannot connect.
	_, err = nats.Connect(host.URL(), nats.Timeout(2*time.Second))
	assert.ErrorIs(t, err, nats.ErrAuthorization)
	_, err = nats.Connect(host.URL(), nats.Token("guess"), nats.Timeout(2*time.Second))
	assert.ErrorIs(t, err, nats.ErrAuthorization)

	// The user's other processes join through the file.
	other := connect(t, Options{URL: host.URL()})
	roundTrip(t, host, other)
}

// Racing embedders agree on one token, and the token survives a takeover:
// clients reconnect to the replacement with the same credentials.
func TestTokenSharedByRacersAndTakeover(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	url := "nats://127.0.0.1:" + freePort(t)
	first, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
	require.NoError(t, err)
	a := connect(t, Options{URL: url, EmbedIfAbsent: true})
	b := connect(t, Options{URL: url})
	closeAndWaitTakeover(t, first, a, b)
	roundTrip(t, a, b)
	_, err = nats.Connect(url, nats.Timeout(2*time.Second))
	assert.ErrorIs(t, err, nats.ErrAuthorization, "the replacement requires the token too")
}

// NATS_TOKEN overrides the file on both sides.
func TestTokenFromEnvironment(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	t.Setenv(EnvToken, "s3cret-token")
	host := connect(t, Options{URL: "nats://127.0.0.1:0"})
	nc, err := nats.Connect(host.URL(), nats.Token("s3cret-token"), nats.Timeout(2*time.Second))
	require.NoError(t, err)
	nc.Close()
	other := connect(t, Options{URL: host.URL()})
	roundTrip(t, host, other)
}

// A runtime directory that others can read is refused, not used.
func TestInsecureRuntimeDirRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Setenv(EnvRuntimeDir, dir)
	_, err := RuntimeDir()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "open to other users")
	_, err = Connect(context.Background(), Options{URL: "nats://127.0.0.1:0", Logger: quiet})
	assert.Error(t, err)
}

// A wrong token is a clear error, not an 18 s wait.
func TestWrongCredentialsFailFast(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	host := connect(t, Options{URL: "nats://127.0.0.1:0"})
	start := time.Now()
	_, err := Connect(context.Background(), Options{URL: host.URL(), Auth: Auth{Token: "wrong"}, Logger: quiet})
	require.Error(t, err)
	assert.ErrorIs(t, err, nats.ErrAuthorization)
	assert.Contains(t, err.Error(), "refused our credentials")
	assert.Less(t, time.Since(start), 3*time.Second)
}

// A host removes its token file when it leaves: the runtime directory
// holds the live servers' files only.
func TestTokenFileRemovedWhenHostLeaves(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	host, err := Connect(context.Background(), Options{URL: "nats://127.0.0.1:0", Logger: quiet})
	require.NoError(t, err)
	_, port, _ := splitAddr(host.URL())
	path, err := TokenFile("127.0.0.1", port)
	require.NoError(t, err)
	require.FileExists(t, path)
	host.Close()
	assert.NoFileExists(t, path)
}

// The token file is named by the network namespace too (Linux): another
// namespace's file for the same address, with its server's token, is
// neither read, nor replaced, nor removed by a host here.
func TestTokenFileOfAnotherNamespaceUntouched(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	ns := netNamespace()
	if ns == "" {
		t.Skip("no network namespaces here (/proc/self/ns/net)")
	}
	port := freePort(t)
	path, err := TokenFile("127.0.0.1", port)
	require.NoError(t, err)
	assert.Equal(t, "nats-127.0.0.1-"+port+"-net"+ns+".token", filepath.Base(path))
	host, gotPort, gotNs, ok := tokenAddr(filepath.Base(path))
	assert.True(t, ok)
	assert.Equal(t, []string{"127.0.0.1", port, ns}, []string{host, gotPort, gotNs})

	theirs := filepath.Join(filepath.Dir(path), tokenName("127.0.0.1", port, "1"+ns))
	require.NoError(t, os.WriteFile(theirs, []byte("their-token\n"), 0o600))
	b, err := Connect(context.Background(), Options{URL: "nats://127.0.0.1:" + port, EmbedIfAbsent: true, Logger: quiet})
	require.NoError(t, err)
	require.True(t, b.Embedded())
	ours, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotEqual(t, "their-token\n", string(ours), "the other namespace's token was taken")
	b.Close()
	assert.NoFileExists(t, path)
	got, err := os.ReadFile(theirs)
	require.NoError(t, err, "the other namespace's file was removed")
	assert.Equal(t, "their-token\n", string(got))
}

// The process that takes an address over writes its token file again, so
// that processes arriving later can join.
func TestTakeoverRewritesTokenFile(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	port := freePort(t)
	url := "nats://127.0.0.1:" + port
	first, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
	require.NoError(t, err)
	path, err := TokenFile("127.0.0.1", port)
	require.NoError(t, err)
	tok, err := os.ReadFile(path)
	require.NoError(t, err)
	a := connect(t, Options{URL: url, EmbedIfAbsent: true})
	first.Close()
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(path)
		return err == nil && string(b) == string(tok) && a.Embedded()
	}, 5*time.Second, 5*time.Millisecond, "the survivor hosts the address and wrote its file again")
	late := connect(t, Options{URL: url})
	roundTrip(t, a, late)
}

// A host starting its server removes the token files of servers that are
// gone (older than staleAfter, nothing listening), and only those.
func TestStaleTokenFilesAreSwept(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	d, err := RuntimeDir()
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, live, _ := net.SplitHostPort(ln.Addr().String())
	old := time.Now().Add(-2 * staleAfter)
	ns := netNamespace()
	other := "1" + ns         // another network namespace
	files := map[string]bool{ // name -> removed by the sweep
		tokenName("127.0.0.1", freePort(t), ns):    true,  // gone and old
		tokenName("127.0.0.1", live, ns):           false, // listening
		tokenName("127.0.0.1", freePort(t), other): false, // another namespace's server
		tokenName("::1", "4222", ns):               false, // a host the name does not keep whole
		"notes.txt":                                false,
	}
	fresh := tokenName("127.0.0.1", freePort(t), ns) // gone, but just written
	for name := range files {
		p := filepath.Join(d, name)
		require.NoError(t, os.WriteFile(p, []byte("x\n"), 0o600))
		require.NoError(t, os.Chtimes(p, old, old))
	}
	require.NoError(t, os.WriteFile(filepath.Join(d, fresh), []byte("x\n"), 0o600))
	files[fresh] = false
	connect(t, Options{URL: "nats://127.0.0.1:0"}) // hosts: sweeps
	for name, removed := range files {
		_, err := os.Stat(filepath.Join(d, name))
		assert.Equal(t, removed, os.IsNotExist(err), name)
	}
}

// TestSquattedRuntimeDirDoesNotBlock: without DYNAMO_CTX_RUNTIME_DIR and
// XDG_RUNTIME_DIR (containers, services, cron, ssh without a login session)
// the runtime directory is <temp dir>/dynamo-ctx-<uid>, a name any other
// user can create first in the shared /tmp. A directory of another user
// there does not stop this user's runtimes: RuntimeDir falls back to the
// user's cache directory, and an embedded NATS server starts. Root only: it
// makes the directory another user's.
func TestSquattedRuntimeDirDoesNotBlock(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to create a directory owned by another user")
	}
	tmp := t.TempDir()
	require.NoError(t, os.Chmod(tmp, 0o1777))
	t.Setenv("TMPDIR", tmp)
	t.Setenv(EnvRuntimeDir, "")
	t.Setenv("XDG_RUNTIME_DIR", "")
	squat := filepath.Join(tmp, fmt.Sprintf("dynamo-ctx-%d", os.Getuid()))
	require.NoError(t, os.Mkdir(squat, 0o700))
	require.NoError(t, os.Chown(squat, 65534, 65534)) // nobody got there first
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	d, err := RuntimeDir()
	assert.NoError(t, err, "another user's directory at the predictable path blocks this user")
	assert.Equal(t, filepath.Join(cache, "dynamo-ctx-run"), d)
	if err == nil {
		b, err := Connect(context.Background(), Options{URL: "nats://127.0.0.1:0", Logger: quiet})
		if assert.NoError(t, err) {
			b.Close()
		}
	}
}
