package killtrace

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("KILLTRACE_CHILD") == "1" {
		Mark("caller.kill", "req-1")
		Mark("worker.ctx_killed", "req-1")
		time.Sleep(3 * flushEvery)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// Off without the variable: nothing is written, Enabled is false.
func TestOffByDefault(t *testing.T) {
	if os.Getenv(Env) != "" {
		t.Skip(Env + " is set for this process")
	}
	Mark("hop", "id")
	assert.False(t, Enabled())
}

// With the variable, each mark is one line: time, hop, id.
func TestMarksLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KILLTRACE_CHILD=1", Env+"="+path)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 2)
	for i, hop := range []string{"caller.kill", "worker.ctx_killed"} {
		f := strings.Fields(lines[i])
		require.Len(t, f, 3)
		assert.Equal(t, hop, f[1])
		assert.Equal(t, "req-1", f[2])
		assert.Len(t, f[0], 19, "unix ns")
	}
}
