package main

import (
	"bytes"
	"encoding/binary"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/zmtp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An abort's body is MessagePack's array of one string, in the shortest form
// for its length (as msgspec, vLLM's decoder, writes and reads it).
func TestAbortBodyIsAMessagePackArrayOfTheID(t *testing.T) {
	for _, c := range []struct {
		n    int
		head []byte
	}{
		{0, []byte{0x91, 0xa0}},
		{31, []byte{0x91, 0xbf}},
		{32, []byte{0x91, 0xd9, 32}},
		{255, []byte{0x91, 0xd9, 255}},
		{256, []byte{0x91, 0xda, 1, 0}},
		{70000, []byte{0x91, 0xdb, 0, 1, 0x11, 0x70}},
	} {
		id := strings.Repeat("r", c.n)
		b := abortBody(id)
		require.True(t, bytes.HasPrefix(b, c.head), "%d: % x", c.n, b[:min(len(b), 8)])
		assert.Equal(t, id, string(b[len(c.head):]), c.n)
	}
}

// The host's form of an input message: malformed ones are refused whole,
// well-formed ones to a peer not connected are dropped without an error.
func TestSendInputReadsTheHostsFormAndRefusesMalformedOnes(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "in"))
	require.NoError(t, err)
	in := &engineInputs{router: zmtp.ServeRouter(ln, func([][]byte) error { return nil }, zmtp.Options{})}
	defer in.close()
	form := func(frames ...[]byte) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(len(frames)))
		for _, f := range frames {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
			b = append(b, f...)
		}
		return b
	}
	assert.NoError(t, sendInput(in, form([]byte("engine"), []byte{0}, []byte("x"))))
	assert.NoError(t, sendInput(in, form([]byte("engine"), nil)))
	good := form([]byte("engine"), []byte{0}, []byte("x"))
	for name, m := range map[string][]byte{
		"empty":        nil,
		"one frame":    form([]byte("engine")),
		"cut short":    good[:len(good)-1],
		"trailing":     append(append([]byte(nil), good...), 0),
		"count lies":   binary.LittleEndian.AppendUint32(nil, 1<<30),
		"length lies":  append(binary.LittleEndian.AppendUint32(nil, 2), 0xff, 0xff, 0xff, 0xff),
		"zero frames":  binary.LittleEndian.AppendUint32(nil, 0),
		"header short": {1, 0},
	} {
		assert.ErrorIs(t, sendInput(in, m), errMalformed, name)
	}
}

// A watch of a context whose request the library aborts in the engine
// fires killHandOff after a kill, on a timer; on a stop, or for a context
// the library aborts nothing of, at once (before the cancel returns). The
// count of a context's armed aborts leaves nothing behind once disarmed.
func TestAKillReachesTheHostAfterTheLibrarysAbort(t *testing.T) {
	armed, stopped, plain := ctxtree.New("armed"), ctxtree.New("stopped"), ctxtree.New("plain")
	before := libraryAborts.len()
	libraryAborts.add(armed, 1)
	libraryAborts.add(armed, 1) // two of its requests, say
	libraryAborts.add(stopped, 1)
	watch := func(c *ctxtree.Context, st ctxtree.State) <-chan time.Time {
		ch := make(chan time.Time, 1)
		c.Notify(st, handOff(c, func() { ch <- time.Now() }))
		return ch
	}

	killed, stoppedW := watch(armed, ctxtree.Killed), watch(armed, ctxtree.Stopped)
	start := time.Now()
	require.True(t, armed.Cancel(ctxtree.Killed, ctxtree.ReasonKill))
	for _, ch := range []<-chan time.Time{killed, stoppedW} {
		select {
		case at := <-ch:
			assert.GreaterOrEqual(t, at.Sub(start), killHandOff)
		case <-time.After(10 * time.Second):
			t.Fatal("a handed-off watch never fired")
		}
	}

	for _, c := range []struct {
		ctx    *ctxtree.Context
		target ctxtree.State
	}{{stopped, ctxtree.Stopped}, {plain, ctxtree.Killed}} {
		ch := watch(c.ctx, ctxtree.Stopped)
		require.True(t, c.ctx.Cancel(c.target, ctxtree.ReasonKill))
		select {
		case <-ch:
		default:
			t.Fatalf("%s: its watch did not fire at once", c.ctx.ID())
		}
	}
	// Already killed when watched, no abort of the library's noted (it
	// aborted nothing here): handed off all of killHandOff.
	watched := time.Now()
	assert.GreaterOrEqual(t, (<-watch(armed, ctxtree.Killed)).Sub(watched), killHandOff)

	libraryAborts.add(armed, -1)
	assert.True(t, libraryAborts.has(armed))
	libraryAborts.add(armed, -1)
	libraryAborts.add(stopped, -1)
	assert.False(t, libraryAborts.has(armed))
	assert.Equal(t, before, libraryAborts.len())
}

// The hand-off counts from the library's abort: a kill that comes after
// the abort left (a stop first) reaches a watch once killHandOff has passed
// since the abort, at once if it has; a watch made after that, at once.
func TestTheHandOffCountsFromTheLibrarysAbort(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "in"))
	require.NoError(t, err)
	in := &engineInputs{router: zmtp.ServeRouter(ln, func([][]byte) error { return nil }, zmtp.Options{})}
	defer in.close()
	e := &engineOutputs{armed: map[string]armedAbort{}}
	e.inputs.Store(in)
	defer e.disarmAll()
	watch := func(c *ctxtree.Context) <-chan time.Time {
		ch := make(chan time.Time, 1)
		c.Notify(ctxtree.Killed, handOff(c, func() { ch <- time.Now() }))
		return ch
	}
	fired := func(ch <-chan time.Time) time.Time {
		select {
		case at := <-ch:
			return at
		case <-time.After(10 * time.Second):
			t.Fatal("a handed-off watch never fired")
			return time.Time{}
		}
	}

	// Stopped (the abort leaves), then killed well after: at once.
	late := &plane.Request{Ctx: ctxtree.New("late")}
	e.arm("eng-late", "eng-late-1", late)
	require.True(t, late.Ctx.Cancel(ctxtree.Stopped, ctxtree.ReasonStopGenerating))
	time.Sleep(killHandOff + time.Millisecond)
	ch := watch(late.Ctx)
	require.True(t, late.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonKill))
	select {
	case <-ch:
	default:
		t.Fatal("a kill long after the library's abort was handed off again")
	}

	// Stopped, killed at once: killHandOff after the abort left, not after
	// the kill; a watch made once that passed fires at once.
	soon := &plane.Request{Ctx: ctxtree.New("soon")}
	e.arm("eng-soon", "eng-soon-1", soon)
	before := time.Now()
	require.True(t, soon.Ctx.Cancel(ctxtree.Stopped, ctxtree.ReasonStopGenerating))
	ch = watch(soon.Ctx)
	time.Sleep(killHandOff / 2)
	assert.LessOrEqual(t, libraryAborts.wait(soon.Ctx), killHandOff/2, "counted from the abort, not the kill")
	require.True(t, soon.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonKill))
	assert.GreaterOrEqual(t, fired(ch).Sub(before), killHandOff)
	time.Sleep(killHandOff)
	select {
	case <-watch(soon.Ctx):
	default:
		t.Fatal("a watch made after the hand-off passed was handed off")
	}
}

// Arming counts a route's context once, whatever replaces, drops or frees
// the route: nothing is left counted once every route is gone, and a
// reader freed arms nothing more.
func TestArmedRoutesLeaveNoContextCounted(t *testing.T) {
	before := libraryAborts.len()
	e := &engineOutputs{armed: map[string]armedAbort{}}
	e.inputs.Store(&engineInputs{})
	a, b := &plane.Request{Ctx: ctxtree.New("a")}, &plane.Request{Ctx: ctxtree.New("b")}
	e.arm("eng-a", "eng-a-1", a)
	e.arm("eng-a", "eng-a-1", a) // armed again: replaces the first
	e.arm("eng-b", "eng-b-1", b)
	e.arm("eng-b2", "eng-b2-1", b) // two routes of one context
	assert.Equal(t, before+2, libraryAborts.len())
	e.disarm("eng-a")
	e.disarm("eng-a") // dropped twice: a no-op
	assert.False(t, libraryAborts.has(a.Ctx))
	e.disarm("eng-b")
	assert.True(t, libraryAborts.has(b.Ctx))
	e.disarmAll()
	assert.Equal(t, before, libraryAborts.len())
	e.arm("eng-c", "eng-c-1", a) // freed: nothing armed
	assert.Equal(t, before, libraryAborts.len())
}

// len is how many contexts are counted (the tests' view).
func (cc *contextCounts) len() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return len(cc.n)
}

// has says whether c is counted (the tests' view; handOff asks wait).
func (cc *contextCounts) has(c *ctxtree.Context) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.n[c].n > 0
}
