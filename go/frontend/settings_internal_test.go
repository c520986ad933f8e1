package frontend

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each setting given as text is read by its one parser into the option it
// gives; what is left out is its default; a value it refuses is a
// *SettingError naming the setting as its source spells it, and the value.
func TestOptionsFromSettings(t *testing.T) {
	limit, adaptive := 3, true
	s := Settings{
		Addr: "127.0.0.1:0", Namespace: "ns", MigrationLimit: &limit, AdaptiveProcs: &adaptive,
		MaxBodyBytes:       &Given{Text: " 1024 ", Source: "DYNAMO_CTX_MAX_BODY_BYTES"},
		MaxIdleConnections: &Given{Text: "7", Source: "--max-idle-connections"},
		RequestTimeout:     &Given{Text: "2.5"},
		MaxQueuedRequests:  &Given{Text: "0"},
	}
	o, err := s.Options()
	require.NoError(t, err)
	require.NoError(t, o.defaults())
	assert.Equal(t, "127.0.0.1:0", o.Addr)
	assert.Equal(t, "ns", o.Namespace)
	assert.Equal(t, 3, o.MigrationLimit)
	assert.Equal(t, int64(1024), o.MaxBodyBytes)
	assert.Equal(t, 7, o.MaxIdleConnections)
	assert.Equal(t, 2500*time.Millisecond, o.RequestTimeout)
	assert.Equal(t, -1, o.MaxQueuedRequests, "0: no queue")
	assert.True(t, o.AdaptiveProcs)
	o, err = Settings{}.Options()
	require.NoError(t, err)
	assert.False(t, o.AdaptiveProcs, "not unless asked")

	// Options a Go caller sets are kept by New's defaults.
	given := Options{MaxBodyBytes: 5, MaxIdleConnections: 6, RequestTimeout: time.Second, MaxQueuedRequests: 8}
	require.NoError(t, given.defaults())
	assert.Equal(t, int64(5), given.MaxBodyBytes)
	assert.Equal(t, 6, given.MaxIdleConnections)
	assert.Equal(t, time.Second, given.RequestTimeout)
	assert.Equal(t, 8, given.MaxQueuedRequests)

	none, err := Settings{}.Options()
	require.NoError(t, err)
	require.NoError(t, none.defaults())
	assert.Equal(t, "dynamo", none.Namespace)
	assert.Equal(t, -1, none.MigrationLimit, "as the workers declare")
	assert.Equal(t, int64(DefaultMaxBodyBytes), none.MaxBodyBytes)
	assert.Equal(t, DefaultMaxIdleConnections, none.MaxIdleConnections)
	assert.Zero(t, none.RequestTimeout)
	assert.Equal(t, DefaultMaxQueuedRequests, none.MaxQueuedRequests)

	for name, bad := range map[string][]string{
		"max_body_bytes":       {"lots", "0", "-1", "1.5", ""},
		"max_idle_connections": {"none", "0", "1e3"},
		"request_timeout":      {"soon", "-1", "nan", "1e12"},
		"max_queued_requests":  {"-1", "many", "1048577"},
	} {
		for _, v := range bad {
			for _, source := range []string{"DYNAMO_CTX_SETTING", "--setting", ""} {
				var s Settings
				*settingField(&s, name) = &Given{Text: v, Source: source}
				err := s.Check()
				var se *SettingError
				if assert.True(t, errors.As(err, &se), "%s=%q: %v", name, v, err) {
					want := source
					if want == "" {
						want = name
					}
					assert.Equal(t, want, se.Name)
					assert.Equal(t, v, se.Value)
					sep := "="
					if source == "--setting" {
						sep = " "
					}
					assert.Contains(t, err.Error(), want+sep+`"`+v+`": `)
				}
			}
		}
	}
}

// settingField is where s holds the text setting named name (textSettings'
// own accessor, so a name it does not know fails the test).
func settingField(s *Settings, name string) **Given {
	fields := map[string]**Given{
		"max_body_bytes": &s.MaxBodyBytes, "max_idle_connections": &s.MaxIdleConnections,
		"request_timeout": &s.RequestTimeout, "max_queued_requests": &s.MaxQueuedRequests,
	}
	for _, t := range textSettings {
		if t.name == name {
			return fields[name]
		}
	}
	panic("no text setting " + name)
}

// Check refuses what Start would, before anything starts.
func TestCheckSettings(t *testing.T) {
	assert.NoError(t, Settings{}.Check())
	assert.NoError(t, Settings{MaxBodyBytes: &Given{Text: "64"}}.Check())
	err := Settings{MaxQueuedRequests: &Given{Text: "-1", Source: "DYNAMO_CTX_MAX_QUEUED_REQUESTS"}}.Check()
	var bad *SettingError
	require.ErrorAs(t, err, &bad)
	assert.Equal(t, "DYNAMO_CTX_MAX_QUEUED_REQUESTS", bad.Name)
}

// The queue bound's range is stated once: the text and the option meet the
// same limit.
func TestMaxQueuedLimitIsOneRange(t *testing.T) {
	_, err := parseMaxQueued("1048576")
	require.NoError(t, err)
	require.NoError(t, (&Options{MaxQueuedRequests: MaxQueuedLimit}).defaults())
	_, err = parseMaxQueued("1048577")
	require.Error(t, err)
	require.Error(t, (&Options{MaxQueuedRequests: MaxQueuedLimit + 1}).defaults())
}

// DecodeSettings reads the members by their exact names, and refuses what
// is not a settings object rather than take a misspelt setting for its
// default.
func TestDecodeSettings(t *testing.T) {
	s, err := DecodeSettings([]byte(`{"addr":"127.0.0.1:0","namespace":"ns","migration_limit":2,` +
		`"max_body_bytes":{"text":"64","source":"--max-body-bytes"},"request_timeout":{"text":"1"},"adaptive_procs":true}`))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:0", s.Addr)
	assert.Equal(t, "ns", s.Namespace)
	require.NotNil(t, s.MigrationLimit)
	assert.Equal(t, 2, *s.MigrationLimit)
	assert.Equal(t, &Given{Text: "64", Source: "--max-body-bytes"}, s.MaxBodyBytes)
	assert.Equal(t, &Given{Text: "1"}, s.RequestTimeout)
	assert.Nil(t, s.MaxQueuedRequests)
	require.NotNil(t, s.AdaptiveProcs)
	assert.True(t, *s.AdaptiveProcs)

	for _, bad := range []string{
		``, `[]`, `"addr"`, `{"addr":1}`, `{"adr":"x"}`, `{"ADDR":"x"}`, `{"addr":"a","addr":"b"}`,
		`{"max_body_bytes":"64"}`, `{"max_body_bytes":{"txt":"64"}}`, `{"max_body_bytes":{"Text":"64"}}`,
		`{"migration_limit":1.5}`, `{"addr":"x"} {}`, `{"adaptive_procs":"yes"}`, `{"Adaptive_Procs":true}`,
	} {
		_, err := DecodeSettings([]byte(bad))
		assert.ErrorIs(t, err, ErrBadSettings, bad)
	}
}
