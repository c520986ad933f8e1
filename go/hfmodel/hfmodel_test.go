package hfmodel

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The frontend's test model (a Llama-3-style tokenizer; see its README).
const testModel = "../frontend/testdata/model"

// dir copies the test model's tokenizer.json into a new directory with the
// given other files.
func dir(t *testing.T, files map[string]string) string {
	t.Helper()
	d := t.TempDir()
	b, err := os.ReadFile(filepath.Join(testModel, TokenizerFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(d, TokenizerFile), b, 0o644))
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(d, name), []byte(body), 0o644))
	}
	return d
}

var msgs = []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: " Hi "}}

func TestTemplateFromEachPlace(t *testing.T) {
	const tpl = `{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m.content | trim }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}`
	const want = "<s>[system]Be brief.[user]Hi[assistant]"
	for name, files := range map[string]map[string]string{
		"config string": {TokenizerConfigFile: `{"bos_token":"<s>","chat_template":` + quote(tpl) + `}`},
		"config list": {TokenizerConfigFile: `{"bos_token":{"content":"<s>","lstrip":false},"chat_template":[{"name":"tool_use","template":"x"},` +
			`{"name":"default","template":` + quote(tpl) + `}]}`},
		"jinja file": {TokenizerConfigFile: `{"bos_token":"<s>"}`, ChatTemplateJinja: tpl},
		"json file":  {TokenizerConfigFile: `{"bos_token":"<s>"}`, ChatTemplateJSON: `{"chat_template":` + quote(tpl) + `}`},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := Load(dir(t, files))
			require.NoError(t, err)
			require.True(t, m.HasChatTemplate())
			got, err := m.RenderChat(msgs)
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}

func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

func TestNoTemplateIsAnErrorOnlyForChat(t *testing.T) {
	m, err := Load(dir(t, nil))
	require.NoError(t, err)
	assert.False(t, m.HasChatTemplate())
	_, err = m.RenderChat(msgs)
	assert.ErrorContains(t, err, "has no chat template")
	ids, err := m.Tokenizer().Encode("Hello world", false)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, ids)
}

func TestRaiseExceptionIsAnError(t *testing.T) {
	m, err := Load(dir(t, map[string]string{ChatTemplateJinja: `{{ raise_exception('roles must alternate') }}`}))
	require.NoError(t, err)
	_, err = m.RenderChat(msgs)
	assert.ErrorContains(t, err, "roles must alternate")
}

func TestBadFilesAreNamed(t *testing.T) {
	_, err := Load(t.TempDir())
	assert.ErrorContains(t, err, TokenizerFile)

	d := dir(t, map[string]string{TokenizerConfigFile: `{"chat_template": 7}`})
	_, err = Load(d)
	assert.ErrorContains(t, err, "chat_template")

	d = dir(t, map[string]string{ChatTemplateJinja: `{% for x in %}`})
	_, err = Load(d)
	assert.ErrorContains(t, err, "does not compile")

	d = dir(t, nil)
	require.NoError(t, os.Remove(filepath.Join(d, TokenizerFile)))
	require.NoError(t, os.Mkdir(filepath.Join(d, TokenizerFile), 0o755))
	_, err = Load(d)
	assert.ErrorContains(t, err, "not a regular file")

	d = dir(t, map[string]string{TokenizerFile: `{"model": {"type": "Mystery"}}`})
	_, err = Load(d)
	assert.ErrorContains(t, err, "Mystery")
}

func TestReadFileIsBounded(t *testing.T) {
	d := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(d, "big"), make([]byte, 1025), 0o644))
	_, err := readFile(d, "big", 1024)
	assert.ErrorContains(t, err, "more than the 1024")
	b, err := readFile(d, "big", 1025)
	require.NoError(t, err)
	assert.Len(t, b, 1025)
}

// A Model is shared by every request of its model.
func TestConcurrentRendering(t *testing.T) {
	m, err := Load(dir(t, map[string]string{ChatTemplateJinja: `{% for m in messages %}{{ m.content }}{% endfor %}`}))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				s, err := m.RenderChat(msgs)
				assert.NoError(t, err)
				ids, err := m.Tokenizer().Encode(s, false)
				assert.NoError(t, err)
				assert.NotEmpty(t, ids)
			}
		}()
	}
	wg.Wait()
}

// BenchmarkRenderChat renders a Llama-3-style template around a message of
// about 4,000 tokens (python/benchmarks/bench_tokenize.py compares it with
// jinja2).
func BenchmarkRenderChat(b *testing.B) {
	d := b.TempDir()
	raw, err := os.ReadFile(filepath.Join(testModel, TokenizerFile))
	require.NoError(b, err)
	require.NoError(b, os.WriteFile(filepath.Join(d, TokenizerFile), raw, 0o644))
	cfg, err := os.ReadFile(filepath.Join(testModel, TokenizerConfigFile))
	require.NoError(b, err)
	require.NoError(b, os.WriteFile(filepath.Join(d, TokenizerConfigFile), cfg, 0o644))
	m, err := Load(d)
	require.NoError(b, err)
	text, err := os.ReadFile("../tokenizer/testdata/bench/prompt.txt")
	require.NoError(b, err)
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: string(text)}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.RenderChat(msgs); err != nil {
			b.Fatal(err)
		}
	}
}
