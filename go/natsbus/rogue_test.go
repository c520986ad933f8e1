package natsbus

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Another user of the machine can bind the embeddable address first (or
// while the user's embedded host is being replaced). A NATS server there
// must be sent neither the user's token nor any request: a Bus on a
// loopback address without explicit credentials joins only a server of its
// own user (ownerDialer). Processes of the same user are trusted with
// everything (docs/security.md), so the rogue here runs as another user.

// rogueEnv tells the test binary, run again as another user, to be the
// rogue listener (TestRogueListenerProcess) on the port it names.
const rogueEnv = "NATSBUS_TEST_ROGUE_PORT"

// TestRogueListenerProcess is the rogue, in a child process run as the user
// nobody: it binds its port (retrying until stdin closes, to race a
// takeover), prints "BOUND", greets each connection as a NATS server that
// requires no authentication, and prints in hex whatever the client sends
// within a second. Skipped in the test run itself.
func TestRogueListenerProcess(t *testing.T) {
	port := os.Getenv(rogueEnv)
	if port == "" {
		t.Skip("the rogue listener of TestRogueServerOnEmbeddableAddress, run in a child process")
	}
	go func() { // stdin closed: the test is done with us
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	var l net.Listener
	for {
		var err error
		if l, err = net.Listen("tcp", "127.0.0.1:"+port); err == nil {
			break
		}
		time.Sleep(200 * time.Microsecond)
	}
	fmt.Println("BOUND")
	var out sync.Mutex
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			_, _ = c.Write([]byte(`INFO {"server_id":"rogue","version":"2.10.0","proto":1,"max_payload":1048576}` + "\r\n"))
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			b, _ := io.ReadAll(io.LimitReader(c, 4096))
			out.Lock()
			fmt.Println("GOT " + hex.EncodeToString(b))
			out.Unlock()
		}()
	}
}

// rogue is TestRogueListenerProcess running as the user nobody.
type rogue struct {
	cmd   *exec.Cmd
	stdin interface{ Close() error }
	mu    sync.Mutex
	got   []string // what clients sent, as received
	bound chan struct{}
	done  chan struct{}
}

func startRogue(t *testing.T, port string) *rogue {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root, to run a listener as another user")
	}
	// The test binary, where the user nobody can run it.
	dir, err := os.MkdirTemp("", "natsbus-rogue")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	self, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	bin := filepath.Join(dir, "rogue.test")
	require.NoError(t, os.WriteFile(bin, self, 0o755))
	cmd := exec.Command(bin, "-test.run=^TestRogueListenerProcess$")
	cmd.Env = []string{rogueEnv + "=" + port}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Dir = "/"
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	r := &rogue{cmd: cmd, stdin: in, bound: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "BOUND":
				close(r.bound)
			case strings.HasPrefix(line, "GOT "):
				b, _ := hex.DecodeString(line[4:])
				r.mu.Lock()
				r.got = append(r.got, string(b))
				r.mu.Unlock()
			}
		}
	}()
	t.Cleanup(r.stop)
	return r
}

func (r *rogue) stop() {
	_ = r.stdin.Close()
	<-r.done
	_ = r.cmd.Wait()
}

func (r *rogue) received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// A NATS server of another user already on the embeddable address is
// refused, with a clear error, and is sent nothing: neither the token of an
// earlier embedded server's file nor a CONNECT line.
func TestRogueServerOnEmbeddableAddress(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	port := freePort(t)
	r := startRogue(t, port)
	select {
	case <-r.bound:
	case <-time.After(10 * time.Second):
		t.Fatal("the rogue did not bind")
	}
	url := "nats://127.0.0.1:" + port
	secret, err := sharedToken("127.0.0.1", port) // an earlier embedded server's token file
	require.NoError(t, err)
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		b, err := Connect(ctx, Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
		cancel()
		if !assert.ErrorIs(t, err, ErrForeignServer) {
			b.Close()
		} else {
			assert.Contains(t, err.Error(), "another user")
		}
	}
	time.Sleep(1200 * time.Millisecond) // the rogue reports each connection after a second
	for _, got := range r.received() {
		assert.NotContains(t, got, secret, "the user's token was sent to another user's server")
		assert.NotContains(t, got, "CONNECT", "a CONNECT line was sent to another user's server")
	}
}

// When the process hosting the embedded server exits, another user who
// keeps trying to bind its port may get there before a survivor does. The
// survivors' reconnects then refuse that listener: the token never reaches
// it (before the owner check it did in 7-8 takeovers of 10).
func TestTakeoverRaceWithRogue(t *testing.T) {
	t.Setenv(EnvRuntimeDir, filepath.Join(t.TempDir(), "rt"))
	const trials = 5
	won, leaked := 0, 0
	for range trials {
		port := freePort(t)
		url := "nats://127.0.0.1:" + port
		host, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
		require.NoError(t, err)
		require.True(t, host.Embedded())
		a, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
		require.NoError(t, err)
		secret, err := readToken("127.0.0.1", port)
		require.NoError(t, err)
		r := startRogue(t, port) // spins on bind while the host holds the port
		time.Sleep(200 * time.Millisecond)
		host.Close()
		select {
		case <-r.bound:
			won++
			time.Sleep(1500 * time.Millisecond) // a's reconnects meet the rogue; each is reported after a second
			assert.False(t, a.nc.IsConnected(), "joined another user's server")
		case <-time.After(1500 * time.Millisecond):
		}
		r.stop()
		for _, got := range r.received() {
			if strings.Contains(got, secret) {
				leaked++
			}
		}
		a.Close()
	}
	t.Logf("the rogue bound the port in %d of %d takeovers", won, trials)
	assert.Zero(t, leaked, "the user's token went to a listener of another user")
}
