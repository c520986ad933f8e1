package main

// The adapter shared by the multiplexers whose streams are plain byte
// streams (yamux, smux): it frames items, routes a worker's stream to the
// caller that expects its token, and carries stop and kill back. Credit is
// the library's own per-stream window (in bytes, not items).
//
// Worker -> caller: a hello frame with the token, then item frames, then an
// end frame; each frame is kind (1 byte), length (4 bytes, big endian),
// payload. Caller -> worker: one byte per control message.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

const (
	kindHello = 'H'
	kindItem  = 'I'
	kindEnd   = 'E'
	ctlStop   = 'S'
	ctlKill   = 'K'
	maxItem   = 1 << 20
)

// rawStream is what yamux and smux streams have in common.
type rawStream interface {
	io.ReadWriteCloser
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// byteMux is a machinery over a multiplexer of byte streams: open makes a
// stream from the worker's side; the caller's side accepts them (acceptLoop).
type byteMux struct {
	open    func() (rawStream, error)
	mu      sync.Mutex
	pending map[string]*bsCaller
	closers []io.Closer
}

func newByteMux(open func() (rawStream, error), closers ...io.Closer) *byteMux {
	return &byteMux{open: open, pending: map[string]*bsCaller{}, closers: closers}
}

func (m *byteMux) Close() {
	for _, c := range m.closers {
		_ = c.Close()
	}
}

// acceptLoop runs on the caller's side for each accepted stream; route reads
// its hello on the stream's own goroutine so a slow one holds up no other.
func (m *byteMux) acceptLoop(accept func() (rawStream, error)) {
	for {
		st, err := accept()
		if err != nil {
			return
		}
		go m.route(st)
	}
}

func (m *byteMux) route(st rawStream) {
	br := bufio.NewReaderSize(st, 1024)
	kind, tok, err := readFrame(br)
	if err != nil || kind != kindHello {
		_ = st.Close()
		return
	}
	m.mu.Lock()
	c := m.pending[string(tok)]
	delete(m.pending, string(tok))
	m.mu.Unlock()
	if c == nil { // a token nobody expects
		_ = st.Close()
		return
	}
	c.mu.Lock()
	c.st, c.br = st, br
	killed, stop := c.killed, c.stopReq
	if !killed {
		close(c.attached)
	}
	c.mu.Unlock()
	if killed {
		c.sendKill(st)
	} else if stop {
		_, _ = st.Write([]byte{ctlStop})
	}
}

func (m *byteMux) Expect(token string) callerStream {
	c := &bsCaller{m: m, token: token, attached: make(chan struct{})}
	m.mu.Lock()
	m.pending[token] = c
	m.mu.Unlock()
	return c
}

func (m *byteMux) Open(ctx context.Context, token string) (workerStream, error) {
	st, err := m.open()
	if err != nil {
		return nil, err
	}
	w := &bsWorker{st: st, stopped: make(chan struct{}), killed: make(chan struct{}),
		lost: make(chan struct{}), readDone: make(chan struct{})}
	if err := w.write(kindHello, []byte(token)); err != nil {
		_ = st.Close()
		return nil, err
	}
	go w.readLoop()
	return w, nil
}

func readFrame(br *bufio.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > maxItem {
		return 0, nil, errors.New("frame too large")
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return 0, nil, err
	}
	return h[0], b, nil
}

// bsCaller is the caller's side.
type bsCaller struct {
	m        *byteMux
	token    string
	attached chan struct{} // closed when the worker's stream arrived, or at a kill
	mu       sync.Mutex
	st       rawStream
	br       *bufio.Reader
	killed   bool
	stopReq  bool
	ended    bool
}

func (c *bsCaller) Recv() ([]byte, error) {
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
	kind, b, err := readFrame(c.br)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.killed: // no item after a kill, whatever was buffered
		return nil, errKilled
	case err != nil:
		return nil, errLost
	case kind == kindEnd:
		c.ended = true
		_ = c.st.Close()
		return nil, io.EOF
	case kind != kindItem:
		return nil, errLost
	}
	return b, nil
}

func (c *bsCaller) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopReq || c.killed || c.ended {
		return
	}
	c.stopReq = true
	if c.st != nil {
		_, _ = c.st.Write([]byte{ctlStop})
	}
}

func (c *bsCaller) Kill() {
	c.mu.Lock()
	if c.killed || c.ended {
		c.mu.Unlock()
		return
	}
	c.killed = true
	st := c.st
	if st == nil { // not attached: route sends the kill when it is
		close(c.attached)
	}
	c.mu.Unlock()
	if st != nil {
		c.sendKill(st)
	}
}

// sendKill writes the kill, wakes a Recv blocked in Read and releases the
// stream (the worker closes its side when it reads the kill).
func (c *bsCaller) sendKill(st rawStream) {
	_, _ = st.Write([]byte{ctlKill})
	_ = st.SetReadDeadline(time.Now())
	_ = st.Close()
}

// bsWorker is the worker's side: its reader goroutine watches for control.
type bsWorker struct {
	st                    rawStream
	buf                   []byte
	stopped, killed, lost chan struct{}
	readDone              chan struct{} // the reader goroutine returned
	mu                    sync.Mutex
	ended                 bool
}

func (w *bsWorker) write(kind byte, p []byte) error {
	w.buf = append(w.buf[:0], kind, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(w.buf[1:], uint32(len(p)))
	w.buf = append(w.buf, p...)
	_, err := w.st.Write(w.buf)
	return err
}

func (w *bsWorker) readLoop() {
	defer close(w.readDone)
	var b [1]byte
	stopped := false
	for {
		if _, err := w.st.Read(b[:]); err != nil {
			w.mu.Lock()
			if !w.ended {
				w.ended = true
				close(w.lost)
				_ = w.st.SetWriteDeadline(time.Now()) // a Send blocked on credit fails now
			}
			w.mu.Unlock()
			return
		}
		switch {
		case b[0] == ctlKill:
			w.mu.Lock()
			if !w.ended {
				w.ended = true
				close(w.killed)
				_ = w.st.SetWriteDeadline(time.Now())
			}
			w.mu.Unlock()
			return
		case b[0] == ctlStop && !stopped:
			stopped = true
			close(w.stopped)
		}
	}
}

func (w *bsWorker) Send(item []byte) error {
	select {
	case <-w.killed:
		return errKilled
	case <-w.lost:
		return errLost
	default:
	}
	if err := w.write(kindItem, item); err != nil {
		<-w.readDone // the reader tells a kill from a loss
		return endErr(w.killed)
	}
	return nil
}

func (w *bsWorker) Finish() error {
	w.mu.Lock()
	if w.ended {
		w.mu.Unlock()
		return endErr(w.killed)
	}
	w.ended = true
	w.mu.Unlock()
	err := w.write(kindEnd, nil)
	_ = w.st.Close()
	return err
}

func (w *bsWorker) Stopped() <-chan struct{} { return w.stopped }
func (w *bsWorker) Killed() <-chan struct{}  { return w.killed }
func (w *bsWorker) Close()                   { _ = w.st.Close() }

// loopbackPair returns a listener and the two ends of one TCP connection
// through it: the worker's (dialled) and the caller's (accepted).
func loopbackPair() (ln net.Listener, worker, caller net.Conn, err error) {
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, nil, err
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	if worker, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		_ = ln.Close()
		return nil, nil, nil, err
	}
	if caller = <-accepted; caller == nil {
		_ = ln.Close()
		return nil, nil, nil, net.ErrClosed
	}
	return ln, worker, caller, nil
}
