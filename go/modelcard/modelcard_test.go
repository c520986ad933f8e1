package modelcard

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The frontend's test model (a Llama-3-style tokenizer; see its README).
const testModel = "../frontend/testdata/model"

// modelCopy copies the test model's text files into a new directory.
func modelCopy(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for _, name := range []string{hfmodel.TokenizerFile, hfmodel.TokenizerConfigFile} {
		b, err := os.ReadFile(filepath.Join(testModel, name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(d, name), b, 0o644))
	}
	return d
}

// The wire format is what the worker wrote before the card had a home, in
// the same order: a frontend of either version reads the other's.
func TestWireFormat(t *testing.T) {
	b, err := json.Marshal(Card{Model: "m", Mode: Agg, MigrationLimit: 2, MaxNumSeqs: 8, MaxModelLen: 512})
	require.NoError(t, err)
	assert.JSONEq(t, `{"model":"m","mode":"agg","migration_limit":2,"max_num_seqs":8,"max_model_len":512}`, string(b))
	assert.Equal(t, `{"model":"m","mode":"agg","migration_limit":2,"max_num_seqs":8,"max_model_len":512}`, string(b))
	b, err = json.Marshal(Card{Model: "m", Mode: Decode})
	require.NoError(t, err)
	assert.Equal(t, `{"model":"m","mode":"decode","migration_limit":0}`, string(b), "what is not declared is left out")

	old := `{"model":"m","mode":"agg","migration_limit":1,"max_num_seqs":4,"max_model_len":8192,"model_path":"/models/m","later":true}`
	c, err := Parse([]byte(old))
	require.NoError(t, err, "unknown keys are ignored")
	assert.Equal(t, Card{Model: "m", Mode: Agg, MigrationLimit: 1, MaxNumSeqs: 4, MaxModelLen: 8192, ModelPath: "/models/m"}, c)
	c, err = Parse([]byte(`{"model":7,"migration_limit":3}`))
	assert.Error(t, err)
	assert.Equal(t, "", c.Model, "a value of the wrong type is left at zero")
}

func TestValidate(t *testing.T) {
	dir := modelCopy(t)
	files, err := hfmodel.ReadDir(dir)
	require.NoError(t, err)
	good := Card{Model: "m", Mode: Prefill, MigrationLimit: 1, ModelPath: dir, TextChecksum: Checksum(files)}
	require.NoError(t, good.Validate())
	for _, m := range Modes {
		assert.NoError(t, Card{Model: "m", Mode: m}.Validate(), m)
	}
	bad := map[string]Card{
		"the model name must not be empty":              {Mode: Agg},
		`mode "aggregated" is not one of agg, prefill`:  {Model: "m", Mode: "aggregated"},
		`mode "" is not one of`:                         {Model: "m"},
		"migration_limit must be 0 or more, got -1":     {Model: "m", Mode: Agg, MigrationLimit: -1},
		"max_num_seqs must be 0 or more":                {Model: "m", Mode: Agg, MaxNumSeqs: -2},
		"max_model_len must be 0 or more":               {Model: "m", Mode: Agg, MaxModelLen: -3},
		`model_path "models/m" must be absolute`:        {Model: "m", Mode: Agg, ModelPath: "models/m", TextChecksum: good.TextChecksum},
		"needs the checksum of its text files":          {Model: "m", Mode: Agg, ModelPath: dir},
		`needs the checksum of its text files, got "x"`: {Model: "m", Mode: Agg, ModelPath: dir, TextChecksum: "x"},
		"a text checksum without a model_path":          {Model: "m", Mode: Agg, TextChecksum: good.TextChecksum},
		"more than the 16384 allowed":                   {Model: strings.Repeat("m", MaxBytes), Mode: Agg},
		`supports "temperature" is not one of`:          {Model: "m", Mode: Agg, Supports: []string{"temperature"}},
		`supports "top_k" is not one of top_k`:          {Model: "m", Mode: Agg, Supports: []string{"top_k", "top_k"}},
	}
	honours := Card{Model: "m", Mode: Agg, Supports: EngineParams}
	require.NoError(t, honours.Validate())
	assert.True(t, honours.Honours("min_p"))
	assert.False(t, good.Honours("min_p"), "a card that lists nothing honours nothing")
	for want, c := range bad {
		err := c.Validate()
		require.ErrorIs(t, err, ErrInvalid, want)
		assert.Contains(t, err.Error(), want)
		_, err = c.JSON()
		assert.ErrorIs(t, err, ErrInvalid, "JSON validates")
	}
	upper := good
	upper.TextChecksum = ChecksumPrefix + strings.ToUpper(good.TextChecksum[len(ChecksumPrefix):])
	assert.Error(t, upper.Validate(), "a checksum as Checksum writes it, prefix and lower-case hex")
}

// Build reads the directory's text files for the checksum, and nothing
// else: a change to any text file is a new checksum, a change elsewhere
// (config.json, the weights) is not.
func TestBuild(t *testing.T) {
	dir := modelCopy(t)
	c, b, err := Build(Card{Model: "m", Mode: Agg, MaxModelLen: 512, ModelPath: dir, TextChecksum: "ignored"})
	require.NoError(t, err)
	files, err := hfmodel.ReadDir(dir)
	require.NoError(t, err)
	assert.Equal(t, Checksum(files), c.TextChecksum)
	parsed, err := Parse(b)
	require.NoError(t, err)
	assert.Equal(t, c, parsed)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"max_position_embeddings":9}`), 0o644))
	same, _, err := Build(Card{Model: "m", Mode: Agg, ModelPath: dir})
	require.NoError(t, err)
	assert.Equal(t, c.TextChecksum, same.TextChecksum)
	require.NoError(t, os.WriteFile(filepath.Join(dir, hfmodel.ChatTemplateJinja), []byte("{{ messages }}"), 0o644))
	changed, _, err := Build(Card{Model: "m", Mode: Agg, ModelPath: dir})
	require.NoError(t, err)
	assert.NotEqual(t, c.TextChecksum, changed.TextChecksum)

	without, b, err := Build(Card{Model: "m", Mode: Agg})
	require.NoError(t, err)
	assert.Empty(t, without.TextChecksum, "no directory, no checksum")
	assert.Equal(t, `{"model":"m","mode":"agg","migration_limit":0}`, string(b))

	_, _, err = Build(Card{Model: "m", Mode: Agg, ModelPath: filepath.Join(dir, "missing")})
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrInvalid, "an unreadable directory is not a bad card")
	assert.Contains(t, err.Error(), "missing")
	_, _, err = Build(Card{Model: "m", Mode: "aggregated", ModelPath: dir})
	assert.ErrorIs(t, err, ErrInvalid)
	_, _, err = Build(Card{Model: "m", Mode: Agg, ModelPath: "relative/dir"})
	assert.ErrorIs(t, err, ErrInvalid, "a relative path is refused, not read")
}

// The bounds are go/hfmodel's: a tokenizer.json past MaxTokenizerBytes is
// not read.
func TestBuildBounded(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, hfmodel.TokenizerFile))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(hfmodel.MaxTokenizerBytes+1))
	require.NoError(t, f.Close())
	_, _, err = Build(Card{Model: "m", Mode: Agg, ModelPath: dir})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "more than the")
}

// The checksum covers each file's name, length and bytes: moving bytes
// between files, or renaming one, is another checksum.
func TestChecksum(t *testing.T) {
	a := Checksum(hfmodel.Files{hfmodel.TokenizerFile: []byte("ab"), hfmodel.TokenizerConfigFile: []byte("c")})
	assert.Equal(t, a, Checksum(hfmodel.Files{hfmodel.TokenizerConfigFile: []byte("c"), hfmodel.TokenizerFile: []byte("ab")}))
	assert.True(t, strings.HasPrefix(a, ChecksumPrefix))
	assert.True(t, validChecksum(a))
	for _, other := range []hfmodel.Files{
		{hfmodel.TokenizerFile: []byte("a"), hfmodel.TokenizerConfigFile: []byte("bc")},
		{hfmodel.TokenizerFile: []byte("ab"), hfmodel.ChatTemplateJinja: []byte("c")},
		{hfmodel.TokenizerFile: []byte("ab")},
		{hfmodel.TokenizerFile: []byte("ab"), hfmodel.TokenizerConfigFile: []byte("c"), hfmodel.ChatTemplateJSON: []byte{}},
	} {
		assert.NotEqual(t, a, Checksum(other))
	}
}
