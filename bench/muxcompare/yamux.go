package main

// hashicorp/yamux: one TCP connection, the worker's session opens a stream
// per request. Everything else is the byte-stream adapter (bytestream.go).

import (
	"io"

	"github.com/hashicorp/yamux"
)

const yamuxKillNote = "no: every frame (data, window update, FIN, RST) waits in one FIFO send queue; " +
	"no public reset (Close sends FIN in order); 2 writes per frame (header, body), no coalescing"

func startYamux() (machinery, error) {
	ln, wc, cc, err := loopbackPair()
	if err != nil {
		return nil, err
	}
	conf := yamux.DefaultConfig()
	conf.AcceptBacklog = 1 << 14 // streams opened faster than the caller accepts them wait here
	conf.LogOutput = io.Discard
	worker, err := yamux.Client(wc, conf)
	if err != nil {
		return nil, err
	}
	caller, err := yamux.Server(cc, conf)
	if err != nil {
		return nil, err
	}
	m := newByteMux(func() (rawStream, error) { return worker.OpenStream() }, worker, caller, ln)
	go m.acceptLoop(func() (rawStream, error) { return caller.AcceptStream() })
	return m, nil
}
