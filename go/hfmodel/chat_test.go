package hfmodel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The template of the tests below: it trims each message's content, as
// Llama 3's does, and reads a request's variable.
const optionsTemplate = `{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] | trim }}[end]{% endfor %}` +
	`{% if add_generation_prompt %}[assistant]{% endif %}{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}`

func optionsModel(t *testing.T, tpl string) *Model {
	t.Helper()
	m, err := Load(dir(t, map[string]string{TokenizerConfigFile: `{"bos_token":"<s>","chat_template":` + quote(tpl) + `}`}))
	require.NoError(t, err)
	return m
}

// A request's options reach the template as apply_chat_template gives them.
func TestChatOptions(t *testing.T) {
	m := optionsModel(t, optionsTemplate)
	for _, c := range []struct {
		name string
		o    ChatOptions
		want string
	}{
		{"defaults of a chat request", ChatOptions{AddGenerationPrompt: true}, "<s>[system]Be brief.[end][user]Hi[end][assistant]"},
		{"no generation prompt", ChatOptions{}, "<s>[system]Be brief.[end][user]Hi[end]"},
		{"a template variable", ChatOptions{AddGenerationPrompt: true, Vars: map[string]any{"enable_thinking": false}},
			"<s>[system]Be brief.[end][user]Hi[end][assistant][no-think]"},
		{"a special token replaced", ChatOptions{Vars: map[string]any{"bos_token": "<B>"}}, "<B>[system]Be brief.[end][user]Hi[end]"},
		// The template trims the content: so is the open message's end.
		{"final message left open", ChatOptions{ContinueFinalMessage: true}, "<s>[system]Be brief.[end][user]Hi"},
	} {
		got, err := m.RenderChatWith(msgs, c.o)
		require.NoError(t, err, c.name)
		assert.Equal(t, c.want, got, c.name)
	}
}

// A template that keeps the content's spacing keeps it in the open final
// message too.
func TestContinueFinalMessageKeepsSpacing(t *testing.T) {
	m := optionsModel(t, `{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}`)
	got, err := m.RenderChatWith([]Message{{Role: "user", Content: "Say"}, {Role: "assistant", Content: "Sure, "}},
		ChatOptions{ContinueFinalMessage: true})
	require.NoError(t, err)
	assert.Equal(t, "<user>Say</user><assistant>Sure, ", got)
}

func TestChatOptionsRefused(t *testing.T) {
	m := optionsModel(t, optionsTemplate)
	for name, o := range map[string]ChatOptions{
		"both":             {AddGenerationPrompt: true, ContinueFinalMessage: true},
		"messages":         {Vars: map[string]any{"messages": []any{}}},
		"chat_template":    {Vars: map[string]any{"chat_template": "x"}},
		"generation flag":  {Vars: map[string]any{"add_generation_prompt": false}},
		"content not kept": {ContinueFinalMessage: true},
	} {
		tpl := m
		if name == "content not kept" {
			tpl = optionsModel(t, `{% for m in messages %}[{{ m.role }}]{% endfor %}`)
		}
		_, err := tpl.RenderChatWith(msgs, o)
		assert.ErrorIs(t, err, ErrChatOptions, name)
	}
}

// Detokenize keeps special tokens, and cleans up tokenization spaces as
// transformers does: where the config asks, for every model but BPE
// unless the config insists.
func TestDetokenize(t *testing.T) {
	for _, c := range []struct {
		config string
		want   string
	}{
		{`{"bos_token":"<|begin_of_text|>"}`, "<|begin_of_text|>Hello , world ."},
		{`{"clean_up_tokenization_spaces":true}`, "<|begin_of_text|>Hello , world ."}, // BPE: not cleaned
		{`{"clean_up_tokenization_spaces":true,"clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output":true}`,
			"<|begin_of_text|>Hello, world."},
	} {
		m, err := Load(dir(t, map[string]string{TokenizerConfigFile: c.config}))
		require.NoError(t, err)
		ids, err := m.Tokenizer().Encode("Hello , world .", true)
		require.NoError(t, err)
		assert.Equal(t, c.want, m.Detokenize(ids), c.config)
		strs := m.TokenStrings(ids)
		require.Len(t, strs, len(ids))
		assert.Equal(t, "<|begin_of_text|>", strs[0])
	}
}

// The clean-up's replacements run one after the other over the whole text,
// so a later one sees what an earlier one made.
func TestCleanUpSpacesInOrder(t *testing.T) {
	assert.Equal(t, "'s", cleanUpSpaces("  ' s"))
	assert.Equal(t, "Don't. Yes, it's", cleanUpSpaces("Do n't . Yes , it 's"))
}
