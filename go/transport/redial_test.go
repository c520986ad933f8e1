package transport

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The worker's liveness declares the caller silent while a redial is under
// way (here during its back-off sleep: the caller dropped 8 connections, the
// 9th is served). The stream must end Lost, as it does without a redial;
// it must not go on over the new connection with its liveness stopped (no
// heartbeats sent, a silent caller never noticed).
func TestSilentDuringRedialIsLost(t *testing.T) {
	served := make(chan struct{}, 1)
	t.Cleanup(func() { goleak.VerifyNone(t) })
	addr, accepted := fakeCaller(t, redialLimit, func(c net.Conn) {
		if _, _, ok := readHello(c); !ok {
			return
		}
		w := frame.NewWriter(c)
		_ = w.WriteCredit(10)
		_ = w.Flush()
		served <- struct{}{}
		// Then say nothing, like a stopped caller; read what comes.
		buf := make([]byte, 64)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
	// Redials sleep 0, 1, 2 ... 64 ms: the 8th sleeps from ~63 to ~127 ms,
	// and the idle timeout of 80 ms expires during that sleep.
	o, err := Dial(context.Background(), addr, "tok",
		WithIdleTimeout(80*time.Millisecond), WithConnectTimeout(5*time.Second))
	require.NoError(t, err)
	defer o.Close()
	select {
	case <-o.Lost():
	case <-time.After(2 * time.Second):
		t.Fatalf("not Lost 2 s after the idle timeout expired (accepted %d, served: %v)",
			accepted.Load(), len(served) > 0)
	}
	waitClosed(t, o.Done(), "Done")
}

// A caller that never reads the Hello (a stopped process: the kernel
// accepts the connection) and a worker with liveness disabled: Finish must
// not wait for the caller's first frame forever. Before redial it returned
// at once; waiting is only useful while a redial could still happen
// (within the connect timeout).
func TestFinishBeforeAttachBounded(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err) // never accepts
	defer ln.Close()
	o, err := Dial(context.Background(), ln.Addr().String(), "tok",
		WithIdleTimeout(-1), WithConnectTimeout(200*time.Millisecond), WithLinger(100*time.Millisecond))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- o.Finish() }()
	select {
	case err := <-done:
		t.Logf("Finish: %v", err)
	case <-time.After(3 * time.Second):
		_ = o.Close() // what a handler cannot do: it is blocked in Finish
		<-done
		t.Fatal("Finish still waiting for the caller's first frame 3 s after the connect timeout")
	}
	_ = ln.Close()
	waitClosed(t, o.Done(), "Done")
}

// Close during a redial's dial: Done follows Close at once; the dial (to a
// caller whose listen queue is full, so the SYN goes unanswered) does not
// hold the reader until the connect timeout.
func TestCloseDuringRedialDoesNotWaitForDial(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	addr := ln.Addr().String()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			acc <- c
		}
	}()
	o, err := Dial(context.Background(), addr, "tok",
		WithIdleTimeout(-1), WithConnectTimeout(3*time.Second))
	require.NoError(t, err)
	first := <-acc
	// Fill the listen queue (never accepted) until a dial times out.
	var fill []net.Conn
	defer func() {
		for _, c := range fill {
			_ = c.Close()
		}
	}()
	for {
		c, err := net.DialTimeout("tcp", addr, 50*time.Millisecond)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				_ = o.Close()
				_ = first.Close()
				<-o.Done()
				t.Skipf("could not fill the listen queue: %v after %d", err, len(fill))
			}
			break
		}
		fill = append(fill, c)
	}
	_ = first.Close() // dropped before the first frame: the worker redials
	time.Sleep(30 * time.Millisecond)
	t0 := time.Now()
	require.NoError(t, o.Close())
	select {
	case <-o.Done():
	case <-time.After(time.Second):
		<-o.Done()
		t.Fatalf("Done %v after Close: the redial's dial went on", time.Since(t0))
	}
}

// A Kill or a Stop the caller sent before the worker's Hello reaches the
// worker over its redial, once: the dropped connection took nothing with it.
func TestKillAndStopBeforeHelloSurviveRedial(t *testing.T) {
	s := listen(t)
	addr, accepted := fakeCaller(t, 1, relayTo(t, s))

	in := expect(t, s, "killed")
	in.KillCause(7)
	outcome := make(chan bool, 1)
	in.KillOutcome(func(aborted bool) { outcome <- aborted })
	o, err := Dial(context.Background(), addr, "killed")
	require.NoError(t, err)
	waitClosed(t, o.Killed(), "Killed")
	require.Equal(t, byte(7), o.KillCause())
	require.False(t, closed(o.Lost()))
	require.ErrorIs(t, o.Finish(), ErrKilled)
	waitClosed(t, o.Done(), "Done")
	select {
	case aborted := <-outcome:
		require.True(t, aborted)
	case <-time.After(waitFor):
		t.Fatal("no kill outcome")
	}
	require.EqualValues(t, 2, accepted.Load())

	addr, accepted = fakeCaller(t, 1, relayTo(t, s))
	in = expect(t, s, "stopped")
	in.Stop()
	o, err = Dial(context.Background(), addr, "stopped")
	require.NoError(t, err)
	waitClosed(t, o.Stopped(), "Stopped")
	require.NoError(t, o.Send(context.Background(), item(1)))
	finishAndRead(t, in, o, []string{string(item(1))})
	require.EqualValues(t, 2, accepted.Load())
}
