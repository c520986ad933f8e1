package transport

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/require"
)

// TestNothingFollowsTheKill: once the Kill is written, no control frame the
// caller had under way (a credit computed by a Recv just before the kill)
// is written after it. The worker stops reading at the Kill and closes; a
// frame left unread would turn its close into a reset, which can destroy
// the worker's last frames on their way to the caller.
func TestNothingFollowsTheKill(t *testing.T) {
	s := listen(t)
	in := expect(t, s, "tok")
	_, _, r := attachedWorker(t, s, "tok")

	in.Kill()
	// What a Recv that took an item just before the kill then writes.
	in.writeControl(func(w *frame.Writer) error { return w.WriteCredit(7) })

	f, err := r.ReadFrame()
	require.NoError(t, err)
	require.Equal(t, frame.Kill, f.Type)
	f, err = r.ReadFrame()
	require.ErrorIs(t, err, io.EOF, "the caller's FIN follows the Kill, nothing else (got %v)", f.Type)
}

// The Kill is the last frame the caller sends (writeKill): a Stop that
// races with it must either go first or not at all. Stop checks killed
// under mu but writes after releasing it, so a Kill can slip in between
// and the Stop follows the Kill on the wire. (The plane writes a caller's
// Stop and Kill frames on the goroutines that cancel: a stop_generating()
// on one thread and a kill() on another race so.)
func TestNoFrameAfterKill(t *testing.T) {
	t.Run("stop", func(t *testing.T) { noFrameAfterKill(t, false) })
	// The same for the credit a Recv grants as the consumer takes an item
	// while another thread kills (the host's consumer and its kill()).
	t.Run("credit", func(t *testing.T) { noFrameAfterKill(t, true) })
}

func noFrameAfterKill(t *testing.T, credit bool) {
	s := listen(t)
	for i := 0; i < 3000 && !t.Failed(); i++ {
		tok := fmt.Sprintf("tok%d", i)
		in := s.Expect(tok, WithWindow(1)) // a grant per item taken
		c, w, r := rawWorker(t, s, tok)
		f, err := r.ReadFrame() // the window: the stream is attached
		require.NoError(t, err)
		require.Equal(t, frame.Credit, f.Type)
		if credit {
			require.NoError(t, w.WriteData(item(i)))
			require.NoError(t, w.Flush())
			for queued(in) == 0 {
				time.Sleep(10 * time.Microsecond)
			}
		}

		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			if credit {
				_, _ = in.Recv(context.Background())
			} else {
				in.Stop()
			}
		}()
		go func() { defer wg.Done(); <-start; in.Kill() }()
		close(start)
		wg.Wait()

		// Read up to the caller's FIN: nothing may follow the Kill.
		_ = c.SetReadDeadline(time.Now().Add(waitFor))
		var got []frame.Type
		for {
			f, err := r.ReadFrame()
			if err != nil {
				break
			}
			got = append(got, f.Type)
		}
		require.NotEmpty(t, got, "iteration %d", i)
		if got[len(got)-1] != frame.Kill {
			t.Errorf("iteration %d: frames after the Kill: %v", i, got)
		}
		c.Close()
		in.Close()
	}
}

// queued is how many items in holds.
func queued(in *Incoming) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.q.len()
}
