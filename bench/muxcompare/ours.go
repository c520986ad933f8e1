package main

// The project's own transport (go/transport): today one TCP connection per
// stream, the worker dialling the caller's Server with the stream's token.
// Stop, kill, credit (in items), the end marker and "no item after kill"
// are the transport's own; the adapter only renames.

import (
	"context"
	"errors"

	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

const oursKillNote = "n/a: each stream has its own connection, so no other stream's data queues ahead of its kill, " +
	"but the kill's read waits its turn among every connection's reads in the poller"

// dialFunc opens a worker's stream: transport.Dial today.
type dialFunc func(ctx context.Context, addr, token string) (*transport.Outgoing, error)

type ours struct {
	srv         *transport.Server
	dial        dialFunc
	closeDialer func() error // the multiplexed transport's Dialer
}

func startOurs() (machinery, error) {
	return startOursWith(func(ctx context.Context, addr, token string) (*transport.Outgoing, error) {
		return transport.Dial(ctx, addr, token)
	})
}

// The multiplexed transport: a Dialer keeps one connection (a session) per
// caller address and opens every stream on it.
const oursMuxKillNote = "yes: a caller writes only control frames, so nothing queues ahead of its kill; " +
	"the worker's session reader hands it to the stream as it reads it"

func startOursMux() (machinery, error) {
	d := transport.NewDialer(0)
	m, err := startOursWith(func(ctx context.Context, addr, token string) (*transport.Outgoing, error) {
		return d.Dial(ctx, addr, token)
	})
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	m.(*ours).closeDialer = d.Close
	return m, nil
}

func startOursWith(dial dialFunc) (machinery, error) {
	srv, err := transport.Listen("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return &ours{srv: srv, dial: dial}, nil
}

func (m *ours) Close() {
	if m.closeDialer != nil {
		_ = m.closeDialer()
	}
	_ = m.srv.Close()
}

func (m *ours) Expect(token string) callerStream { return oursCaller{m.srv.Expect(token)} }

func (m *ours) Open(ctx context.Context, token string) (workerStream, error) {
	o, err := m.dial(ctx, m.srv.Addr().String(), token)
	if err != nil {
		return nil, err
	}
	return oursWorker{o}, nil
}

type oursCaller struct{ in *transport.Incoming }

func (c oursCaller) Recv() ([]byte, error) {
	b, err := c.in.Recv(context.Background())
	if errors.Is(err, transport.ErrKilled) {
		return nil, errKilled
	}
	return b, err
}

func (c oursCaller) Stop() { c.in.Stop() }
func (c oursCaller) Kill() { c.in.Kill() }

type oursWorker struct{ o *transport.Outgoing }

func (w oursWorker) Send(item []byte) error {
	err := w.o.Send(context.Background(), item)
	if errors.Is(err, transport.ErrKilled) {
		return errKilled
	}
	return err
}

func (w oursWorker) Finish() error            { return w.o.Finish() }
func (w oursWorker) Stopped() <-chan struct{} { return w.o.Stopped() }
func (w oursWorker) Killed() <-chan struct{}  { return w.o.Killed() }
func (w oursWorker) Close()                   { _ = w.o.Close() }
