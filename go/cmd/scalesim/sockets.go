package main

import (
	"bufio"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// TCP states as /proc/net/tcp writes them.
const (
	tcpEstablished = 0x01
	tcpTimeWait    = 0x06
)

// socket is one line of /proc/net/tcp: its local and remote ports, and
// its state.
type socket struct {
	local, remote int
	state         int
}

// sockets reads the machine's IPv4 TCP sockets (Linux only; elsewhere an
// error, and the simulation reports the socket figures as unknown).
func sockets() ([]socket, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []socket
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 {
			continue
		}
		lp, err1 := hexPort(fields[1])
		rp, err2 := hexPort(fields[2])
		st, err3 := strconv.ParseUint(fields[3], 16, 8)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		out = append(out, socket{local: lp, remote: rp, state: int(st)})
	}
	return out, sc.Err()
}

// hexPort reads the port of an "ADDR:PORT" field of /proc/net/tcp.
func hexPort(field string) (int, error) {
	i := strings.LastIndexByte(field, ':')
	if i < 0 {
		return 0, errors.New("no port")
	}
	p, err := strconv.ParseUint(field[i+1:], 16, 16)
	return int(p), err
}

// freePort returns a loopback port nothing listens on now, for a stream
// server whose port the simulation needs to know (to count its sockets).
//
// It is drawn at random below the kernel's range for outgoing connections'
// source ports (ip_local_port_range), so that none of the simulation's many
// connections takes it between this check and its listener's bind; the
// kernel's pick when none there is free.
func freePort() (int, error) {
	if low := ephemeralLow(); low > 11000 {
		for range 64 {
			p := 10000 + rand.IntN(low-10000)
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
				_ = l.Close()
				return p, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the lowest port of the kernel's range for outgoing
// connections (32768 when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}

// streamSockets counts the stream connections of the simulated processes:
// established sockets whose local port is one of their stream servers'
// (the accepting end of each connection, whichever side dials), per port,
// and the TIME_WAIT sockets that have such a port at either end.
func streamSockets(ports map[int]bool) (established map[int]int, timeWait int, err error) {
	socks, err := sockets()
	if err != nil {
		return nil, 0, err
	}
	established = map[int]int{}
	for _, s := range socks {
		switch s.state {
		case tcpEstablished:
			if ports[s.local] {
				established[s.local]++
			}
		case tcpTimeWait:
			if ports[s.local] || ports[s.remote] {
				timeWait++
			}
		}
	}
	return established, timeWait, nil
}
