//go:build linux

package rawio_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

func TestTryWriteTakesWhatFitsAndSaysWhenFull(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])
	n, e := rawio.TryWrite(uintptr(fds[0]), []byte("hello"))
	require.Zero(t, e)
	assert.Equal(t, 5, n)
	n, e = rawio.TryWrite(uintptr(fds[0]), nil)
	assert.Zero(t, e)
	assert.Zero(t, n)
	big := make([]byte, 1<<20)
	for e == 0 {
		_, e = rawio.TryWrite(uintptr(fds[0]), big)
	}
	assert.Equal(t, syscall.EAGAIN, e, "a full socket: EAGAIN, never a wait")
	n, e = rawio.TryWriteAll(uintptr(fds[0]), big)
	assert.Equal(t, syscall.EAGAIN, e)
	assert.Zero(t, n, "full: nothing taken")
	buf := make([]byte, 64<<10)
	_, err = syscall.Read(fds[1], buf) // room for some
	require.NoError(t, err)
	n, e = rawio.TryWriteAll(uintptr(fds[0]), big)
	assert.Positive(t, n, "what fits is taken")
	assert.Less(t, n, len(big))
	assert.Equal(t, syscall.EAGAIN, e)
	n, e = rawio.TryWriteAll(uintptr(fds[0]), nil)
	assert.Zero(t, n)
	assert.Zero(t, e)
	_, e = rawio.TryWrite(^uintptr(0)>>1, big)
	assert.Equal(t, syscall.EBADF, e)
}

func TestTryReadTakesWhatIsThereAndSaysWhenEmpty(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])
	buf := make([]byte, 16)
	_, e := rawio.TryRead(uintptr(fds[1]), buf)
	assert.Equal(t, syscall.EAGAIN, e, "empty: EAGAIN, never a wait")
	_, err = syscall.Write(fds[0], []byte("one"))
	require.NoError(t, err)
	_, err = syscall.Write(fds[0], []byte("two!"))
	require.NoError(t, err)
	n, e := rawio.TryRead(uintptr(fds[1]), buf)
	require.Zero(t, e)
	assert.Equal(t, "one", string(buf[:n]), "one message a read")
	n, e = rawio.TryRead(uintptr(fds[1]), buf)
	require.Zero(t, e)
	assert.Equal(t, "two!", string(buf[:n]))
	n, e = rawio.TryRead(uintptr(fds[1]), nil)
	assert.Zero(t, n)
	assert.Zero(t, e)
	_, e = rawio.TryRead(^uintptr(0)>>1, buf)
	assert.Equal(t, syscall.EBADF, e)
}

func TestEpollCallsSeeReadiness(t *testing.T) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	require.NoError(t, err)
	defer syscall.Close(epfd)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])

	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: 7}
	require.Zero(t, rawio.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, fds[1], &ev))
	events := make([]syscall.EpollEvent, 4)
	n, e := rawio.EpollWait(epfd, events)
	require.Zero(t, e)
	assert.Zero(t, n, "nothing ready, and no wait")
	assert.False(t, rawio.Readable(uintptr(epfd)), "the set with nothing ready")
	assert.False(t, rawio.Readable(uintptr(fds[1])))

	_, err = syscall.Write(fds[0], []byte("x"))
	require.NoError(t, err)
	assert.True(t, rawio.Readable(uintptr(fds[1])))
	assert.True(t, rawio.Readable(uintptr(epfd)), "the set with an event ready")
	assert.False(t, rawio.Readable(^uintptr(0)>>33), "a descriptor that is not open")
	n, e = rawio.EpollWait(epfd, events)
	require.Zero(t, e)
	require.Equal(t, 1, n)
	assert.EqualValues(t, 7, events[0].Fd)
	n, e = rawio.EpollWait(epfd, nil)
	assert.Zero(t, n)
	assert.Zero(t, e)

	require.Zero(t, rawio.EpollCtl(epfd, syscall.EPOLL_CTL_DEL, fds[1], nil))
	n, _ = rawio.EpollWait(epfd, events)
	assert.Zero(t, n, "removed")
	assert.Equal(t, syscall.ENOENT, rawio.EpollCtl(epfd, syscall.EPOLL_CTL_DEL, fds[1], nil))
	assert.Equal(t, syscall.EBADF, rawio.EpollCtl(-1, syscall.EPOLL_CTL_ADD, fds[1], &ev))
}
