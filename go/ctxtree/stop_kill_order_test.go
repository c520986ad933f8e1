package ctxtree

import (
	"testing"
)

// A kill that overtakes a stop still running its hooks closes the Stopped
// channel before the Killed one: who sees Killed closed sees Stopped closed.
func TestKilledChannelNeverClosesBeforeStopped(t *testing.T) {
	c := New("x")
	stopCh, killCh := c.Stopped(), c.Killed()
	inHook, release := make(chan struct{}), make(chan struct{})
	c.Notify(Stopped, func() { close(inHook); <-release })
	go c.Cancel(Stopped, ReasonStopGenerating)
	<-inHook
	c.Cancel(Killed, ReasonKill) // returns: the context is Killed
	<-killCh
	select {
	case <-stopCh:
	default:
		t.Errorf("Killed channel closed, Stopped channel still open, after Cancel(Killed) returned")
	}
	close(release)
}
