package main

// Route links that can be cut: a node lost as a crash loses it, with no
// goodbye to its peers. nats-server's Shutdown first hands the leadership
// of every Raft group it leads to a peer (a graceful stepdown), so the
// cluster elects no one; a node that dies (a kill, a power loss) cannot,
// and its peers elect a new leader only once their election timeout runs
// out. So each node reaches each peer through a proxy of its own here,
// and the loss of a node cuts its proxies first.

import (
	"io"
	"net"
	"sync"
)

// link forwards the route connections that one node dials to one peer.
type link struct {
	from, to int
	l        net.Listener
	target   string

	mu    sync.Mutex
	cut   bool
	conns []net.Conn
	wg    sync.WaitGroup
}

func newLink(from, to int, target string) (*link, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	k := &link{from: from, to: to, l: l, target: target}
	k.wg.Add(1)
	go k.accept()
	return k, nil
}

func (k *link) addr() string { return k.l.Addr().String() }

func (k *link) accept() {
	defer k.wg.Done()
	for {
		c, err := k.l.Accept()
		if err != nil {
			return // cut
		}
		d, err := net.Dial("tcp", k.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		k.mu.Lock()
		if k.cut {
			k.mu.Unlock()
			_ = c.Close()
			_ = d.Close()
			continue
		}
		k.conns = append(k.conns, c, d)
		k.wg.Add(2)
		k.mu.Unlock()
		go k.pipe(c, d)
		go k.pipe(d, c)
	}
}

func (k *link) pipe(dst, src net.Conn) {
	defer k.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}

// close cuts the link: its connections end at once and no new one is
// accepted. It returns once every copy ended.
func (k *link) close() {
	k.mu.Lock()
	k.cut = true
	conns := k.conns
	k.conns = nil
	k.mu.Unlock()
	_ = k.l.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	k.wg.Wait()
}
