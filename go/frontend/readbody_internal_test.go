package frontend

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readBody grows its buffer as the body arrives, never past the declared
// length, and reads exactly what was declared (a short body is an error;
// a body over the limit is a *http.MaxBytesError, whether declared or not).
func TestReadBodyGrowsAsBytesArrive(t *testing.T) {
	const limit = 1 << 20
	for _, size := range []int{0, 1, firstBodyChunk - 1, firstBodyChunk, firstBodyChunk + 1, 3*firstBodyChunk + 7, limit} {
		want := bytes.Repeat([]byte("abcdefg"), size/7+1)[:size]
		for _, declared := range []bool{true, false} {
			r := httptest.NewRequest(http.MethodPost, "/", iotest.HalfReader(bytes.NewReader(want)))
			r.ContentLength = -1
			if declared {
				r.ContentLength = int64(size)
			}
			got, err := readBody(httptest.NewRecorder(), r, limit)
			require.NoError(t, err, "size %d", size)
			assert.Equal(t, want, got, "size %d", size)
			if declared {
				assert.LessOrEqual(t, cap(got), size, "size %d: the buffer grew past the declared length", size)
			}
		}
	}
	// Declared but cut short.
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", 100_000)))
	r.ContentLength = 200_000
	_, err := readBody(httptest.NewRecorder(), r, limit)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	// Over the limit, declared or not.
	for _, declared := range []int64{-1, limit + 1} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", limit+1)))
		r.ContentLength = declared
		_, err := readBody(httptest.NewRecorder(), r, limit)
		var mbe *http.MaxBytesError
		assert.True(t, errors.As(err, &mbe), "declared %d: %v", declared, err)
	}
}
