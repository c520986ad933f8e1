package plane_test

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestZZDebug(t *testing.T) {
	host := startEmbedded(t)
	wrt := join(t, host)
	f := newFlood(100000)
	serve(t, wrt, "a.b.c", f.handle)
	c := newClient(t, host, "a.b.c")
	waitInstances(t, c, 1)
	s := generate(t, c, `{}`, nil)
	require.NoError(t, waitStarted(s))
	recv(t, f.reqs, "req")
	t.Log("blocked at", f.waitBlocked(t))
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	for _, g := range bytes.Split(buf[:n], []byte("\n\n")) {
		if bytes.Contains(g, []byte("plane.(*")) {
			t.Logf("%s\n", g)
		}
	}
	drainAll(s)
}
