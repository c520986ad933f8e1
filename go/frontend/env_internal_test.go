package frontend

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each variable is read by its one parser into the option it gives, only
// for the options left zero; a value it refuses is a *SettingError naming
// the variable and the value.
func TestOptionsFromEnvironment(t *testing.T) {
	vars := map[string]string{
		EnvMaxBodyBytes:       " 1024 ",
		EnvMaxIdleConnections: "7",
		EnvRequestTimeout:     "2.5",
		EnvMaxQueuedRequests:  "0",
	}
	o := Options{Getenv: func(name string) string { return vars[name] }}
	require.NoError(t, o.defaults())
	assert.Equal(t, int64(1024), o.MaxBodyBytes)
	assert.Equal(t, 7, o.MaxIdleConnections)
	assert.Equal(t, 2500*time.Millisecond, o.RequestTimeout)
	assert.Equal(t, -1, o.MaxQueuedRequests, "0: no queue")

	given := Options{MaxBodyBytes: 5, MaxIdleConnections: 6, RequestTimeout: time.Second, MaxQueuedRequests: 8,
		Getenv: func(name string) string { return "not looked up" }}
	require.NoError(t, given.defaults())
	assert.Equal(t, int64(5), given.MaxBodyBytes)
	assert.Equal(t, 6, given.MaxIdleConnections)
	assert.Equal(t, time.Second, given.RequestTimeout)
	assert.Equal(t, 8, given.MaxQueuedRequests)

	none := Options{Getenv: func(string) string { return "" }}
	require.NoError(t, none.defaults())
	assert.Equal(t, int64(DefaultMaxBodyBytes), none.MaxBodyBytes)
	assert.Equal(t, DefaultMaxIdleConnections, none.MaxIdleConnections)
	assert.Zero(t, none.RequestTimeout)
	assert.Equal(t, DefaultMaxQueuedRequests, none.MaxQueuedRequests)

	for name, bad := range map[string][]string{
		EnvMaxBodyBytes:       {"lots", "0", "-1", "1.5"},
		EnvMaxIdleConnections: {"none", "0", "1e3"},
		EnvRequestTimeout:     {"soon", "-1", "nan", "1e12"},
		EnvMaxQueuedRequests:  {"-1", "many", "1048577"},
	} {
		for _, v := range bad {
			o := Options{Getenv: func(n string) string {
				if n == name {
					return v
				}
				return ""
			}}
			err := o.defaults()
			var se *SettingError
			if assert.True(t, errors.As(err, &se), "%s=%q: %v", name, v, err) {
				assert.Equal(t, name, se.Name)
				assert.Equal(t, v, se.Value)
				assert.Contains(t, err.Error(), name+"=")
			}
		}
	}
}

// CheckSettings refuses what New would, before anything starts.
func TestCheckSettings(t *testing.T) {
	assert.NoError(t, CheckSettings(func(string) string { return "" }))
	assert.NoError(t, CheckSettings(func(name string) string { return map[string]string{EnvMaxBodyBytes: "64"}[name] }))
	err := CheckSettings(func(name string) string { return map[string]string{EnvMaxQueuedRequests: "-1"}[name] })
	var bad *SettingError
	require.ErrorAs(t, err, &bad)
	assert.Equal(t, EnvMaxQueuedRequests, bad.Name)
}
