package main

// xtaci/smux (protocol version 2: per-stream windows): one TCP connection,
// the worker's session opens a stream per request. Everything else is the
// byte-stream adapter (bytestream.go).

import "github.com/xtaci/smux"

const smuxKillNote = "partly: window updates and pings go in a control class written ahead of data, " +
	"but FIN (Close) and an in-band kill are data class, in order; no reset frame; one writev per frame"

func startSmux() (machinery, error) {
	ln, wc, cc, err := loopbackPair()
	if err != nil {
		return nil, err
	}
	conf := smux.DefaultConfig()
	conf.Version = 2 // per-stream flow control: a slow stream holds up no other
	worker, err := smux.Client(wc, conf)
	if err != nil {
		return nil, err
	}
	caller, err := smux.Server(cc, conf)
	if err != nil {
		return nil, err
	}
	m := newByteMux(func() (rawStream, error) { return worker.OpenStream() }, worker, caller, ln)
	go m.acceptLoop(func() (rawStream, error) { return caller.AcceptStream() })
	return m, nil
}
