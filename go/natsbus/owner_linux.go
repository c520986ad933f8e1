package natsbus

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// ownerOf returns the user that owns the server's end of the loopback TCP
// connection c: the kernel lists it in /proc/net/tcp (or tcp6, for a
// dual-stack listener) under the uid of whoever created the listening
// socket, from the moment the handshake completes. known is false where
// /proc/net is missing (then nothing can be checked).
func ownerOf(c net.Conn) (uid int, known bool, err error) {
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return 0, false, nil
	}
	// The server's end: its local address is our remote one, and back.
	keys := [][2]string{}
	for _, v6 := range []bool{false, true} {
		s, ok3 := procAddr(remote, v6)
		p, ok4 := procAddr(local, v6)
		if ok3 && ok4 {
			keys = append(keys, [2]string{s, p})
		}
	}
	missing := 0
	for attempt := 0; attempt < 20; attempt++ {
		missing = 0
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			u, found, err := findSocket(f, keys)
			if errors.Is(err, fs.ErrNotExist) {
				missing++
				continue
			}
			if err != nil {
				return 0, false, err
			}
			if found {
				return u, true, nil
			}
		}
		if missing == 2 {
			return 0, false, nil // no /proc/net here: nothing to check
		}
		time.Sleep(time.Millisecond) // the server's end not listed yet
	}
	return 0, false, errors.New("the server's end of the connection is not listed in /proc/net/tcp")
}

// procAddr writes a as /proc/net/tcp (v6: tcp6) lists it: each 32-bit word
// of the address in the machine's byte order, in hex, then the port.
func procAddr(a *net.TCPAddr, v6 bool) (string, bool) {
	var ip net.IP
	if v6 {
		ip = a.IP.To16()
	} else {
		ip = a.IP.To4()
	}
	if ip == nil {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(ip); i += 4 {
		fmt.Fprintf(&b, "%08X", binary.NativeEndian.Uint32(ip[i:i+4]))
	}
	fmt.Fprintf(&b, ":%04X", a.Port)
	return b.String(), true
}

// findSocket looks in file (a /proc/net/tcp table) for a socket whose local
// and remote addresses are one of keys, and returns its uid.
func findSocket(file string, keys [][2]string) (int, bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local rem st tx:rx tr:when retrnsmt uid ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 {
			continue
		}
		for _, k := range keys {
			if fields[1] == k[0] && fields[2] == k[1] {
				uid, err := strconv.Atoi(fields[7])
				if err != nil {
					return 0, false, fmt.Errorf("%s: bad uid %q", file, fields[7])
				}
				return uid, true, nil
			}
		}
	}
	return 0, false, sc.Err()
}
