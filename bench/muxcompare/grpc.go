package main

// gRPC bidi streams over one client connection, with a codec that passes
// []byte messages through (no protoc). The worker is the gRPC client, as it
// dials the caller today: it opens one call per request, its first message
// the token. The caller's handler ends the call to kill it (the worker sees
// status Aborted); stop is a one-byte message back. Credit is HTTP/2's
// per-stream window (bytes).

import (
	"context"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const grpcKillNote = "yes: RST_STREAM and window updates go through the connection's control queue, " +
	"the killed stream's queued data is dropped before its reset is written; one writer batches frames into few writes"

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

var grpcDesc = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}

const grpcMethod = "/muxcompare.Relay/Stream"

type grpcMux struct {
	srv     *grpc.Server
	cc      *grpc.ClientConn
	mu      sync.Mutex
	pending map[string]*grpcCaller
}

func startGRPC() (machinery, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	m := &grpcMux{pending: map[string]*grpcCaller{}}
	m.srv = grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	desc := grpcDesc
	desc.Handler = func(_ any, ss grpc.ServerStream) error { return m.handle(ss) }
	m.srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "muxcompare.Relay",
		HandlerType: (*any)(nil),
		Streams:     []grpc.StreamDesc{desc},
	}, struct{}{})
	go func() { _ = m.srv.Serve(ln) }()
	m.cc, err = grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		m.srv.Stop()
		return nil, err
	}
	return m, nil
}

func (m *grpcMux) Close() {
	_ = m.cc.Close()
	m.srv.Stop()
}

// handle runs on the caller's side for each call, for as long as the call.
func (m *grpcMux) handle(ss grpc.ServerStream) error {
	var hello []byte
	if err := ss.RecvMsg(&hello); err != nil {
		return err
	}
	m.mu.Lock()
	c := m.pending[string(hello)]
	delete(m.pending, string(hello))
	m.mu.Unlock()
	if c == nil {
		return status.Error(codes.PermissionDenied, "unexpected stream")
	}
	c.mu.Lock()
	c.ss = ss
	if !c.killed {
		close(c.attached)
		if c.stopReq {
			_ = ss.SendMsg(&[]byte{ctlStop})
		}
	}
	c.mu.Unlock()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killed {
		return status.Error(codes.Aborted, "killed")
	}
	return nil
}

func (m *grpcMux) Expect(token string) callerStream {
	c := &grpcCaller{attached: make(chan struct{}), done: make(chan struct{})}
	m.mu.Lock()
	m.pending[token] = c
	m.mu.Unlock()
	return c
}

// grpcCaller is the caller's side. Its mutex also keeps SendMsg from racing
// with the handler's return.
type grpcCaller struct {
	attached chan struct{} // closed when the worker's call arrived, or at a kill
	done     chan struct{} // closed at the end or at a kill: the handler returns
	mu       sync.Mutex
	ss       grpc.ServerStream
	killed   bool
	stopReq  bool
	ended    bool
}

func (c *grpcCaller) Recv() ([]byte, error) {
	<-c.attached
	c.mu.Lock()
	killed, ended := c.killed, c.ended
	c.mu.Unlock()
	if killed {
		return nil, errKilled
	}
	if ended {
		return nil, io.EOF
	}
	var b []byte
	err := c.ss.RecvMsg(&b)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.killed: // no item after a kill
		return nil, errKilled
	case err != nil:
		c.ended = true
		close(c.done)
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, errLost
	}
	return b, nil
}

func (c *grpcCaller) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopReq || c.killed || c.ended {
		return
	}
	c.stopReq = true
	if c.ss != nil {
		_ = c.ss.SendMsg(&[]byte{ctlStop})
	}
}

func (c *grpcCaller) Kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killed || c.ended {
		return
	}
	c.killed = true
	if c.ss == nil {
		close(c.attached)
	}
	close(c.done)
}

func (m *grpcMux) Open(ctx context.Context, token string) (workerStream, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cs, err := m.cc.NewStream(sctx, &grpcDesc, grpcMethod, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		cancel()
		return nil, err
	}
	tok := []byte(token)
	if err := cs.SendMsg(&tok); err != nil {
		cancel()
		return nil, err
	}
	w := &grpcWorker{cs: cs, cancel: cancel, stopped: make(chan struct{}), killed: make(chan struct{}),
		lost: make(chan struct{}), readDone: make(chan struct{})}
	go w.readLoop()
	return w, nil
}

// grpcWorker is the worker's side: its reader goroutine watches for control.
type grpcWorker struct {
	cs                    grpc.ClientStream
	cancel                context.CancelFunc
	stopped, killed, lost chan struct{}
	readDone              chan struct{} // the reader goroutine returned
	mu                    sync.Mutex
	ended                 bool
}

func (w *grpcWorker) readLoop() {
	defer close(w.readDone)
	defer w.cancel()
	stopped := false
	for {
		var b []byte
		if err := w.cs.RecvMsg(&b); err != nil {
			w.mu.Lock()
			if !w.ended {
				w.ended = true
				if status.Code(err) == codes.Aborted {
					close(w.killed)
				} else {
					close(w.lost)
				}
			}
			w.mu.Unlock()
			return
		}
		if len(b) == 1 && b[0] == ctlStop && !stopped {
			stopped = true
			close(w.stopped)
		}
	}
}

func (w *grpcWorker) Send(item []byte) error {
	select {
	case <-w.killed:
		return errKilled
	case <-w.lost:
		return errLost
	default:
	}
	if err := w.cs.SendMsg(&item); err != nil {
		<-w.readDone // the call's status tells a kill from a loss
		return endErr(w.killed)
	}
	return nil
}

func (w *grpcWorker) Finish() error {
	w.mu.Lock()
	if w.ended {
		w.mu.Unlock()
		return endErr(w.killed)
	}
	w.ended = true
	w.mu.Unlock()
	return w.cs.CloseSend()
}

func (w *grpcWorker) Stopped() <-chan struct{} { return w.stopped }
func (w *grpcWorker) Killed() <-chan struct{}  { return w.killed }
func (w *grpcWorker) Close()                   { w.cancel() }
