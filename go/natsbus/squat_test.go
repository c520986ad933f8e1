package natsbus

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSquattedRuntimeDirDoesNotBlock (review finding, 2026-12-04): without
// DYNAMO_CTX_RUNTIME_DIR and XDG_RUNTIME_DIR (containers, services, cron,
// ssh without a login session) the runtime directory is
// <temp dir>/dynamo-ctx-<uid>, a name any other user can create first in the
// shared /tmp. RuntimeDir then refuses it ("belongs to another user"), so
// every runtime of the victim user fails to start, embedded NATS or client
// of one (reproduced with processes: `setpriv --reuid=65534 mkdir -m 700
// $TMPDIR/dynamo-ctx-0`, then DistributedRuntime() as root fails with
// "dc_runtime_new: natsbus: .../dynamo-ctx-0 belongs to another user").
// Root only: it makes the directory another user's.
func TestSquattedRuntimeDirDoesNotBlock(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to create a directory owned by another user")
	}
	tmp := t.TempDir()
	require.NoError(t, os.Chmod(tmp, 0o1777))
	t.Setenv("TMPDIR", tmp)
	t.Setenv(EnvRuntimeDir, "")
	t.Setenv("XDG_RUNTIME_DIR", "")
	squat := filepath.Join(tmp, fmt.Sprintf("dynamo-ctx-%d", os.Getuid()))
	require.NoError(t, os.Mkdir(squat, 0o700))
	require.NoError(t, os.Chown(squat, 65534, 65534)) // nobody got there first
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	d, err := RuntimeDir()
	assert.NoError(t, err, "another user's directory at the predictable path blocks this user")
	assert.Equal(t, filepath.Join(cache, "dynamo-ctx-run"), d)
	if err == nil {
		b, err := Connect(context.Background(), Options{URL: "nats://127.0.0.1:0", Logger: quiet})
		if assert.NoError(t, err) {
			b.Close()
		}
	}
}
