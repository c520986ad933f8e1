package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func collect(t testing.TB, m matcher, s string) [][2]int {
	var out [][2]int
	require.NoError(t, m.findAll(s, func(a, b int) error {
		out = append(out, [2]int{a, b})
		return nil
	}))
	return out
}

// Pieces of text the split patterns treat differently: every class of the
// patterns, the characters around their boundaries, and runs of them.
var trickyPieces = []string{
	" ", " ", "  ", "\t", "\n", "\r", "\r\n", "\n\n", "\v", "\f", "\u0085", "\u00a0", "\u3000", "\u2028", "\u1680",
	"\u180e", "\u200b", "'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "'x", "a", "Z", "é",
	"e\u0301", "\u0301", "ß", "İ", "Σ", "你好", "こ", "한", "م", "न्", "1", "23", "4567", "٣", "²", "½", "Ⅷ", "①",
	".", ",", "!", "?", "-", "_", "(", ")", "\"", "#", "$", "%", "&", "*", "+", "=", "@", "^", "`", "~", "|", "\\",
	"/", "<", ">", "[", "]", "{", "}", "\x00", "\x1c", "\x7f", "🙂", "👍🏽", "\u200d", "🇫🇷", "\ufeff", "\ue000",
	"\U00010348", "hello", "World", "x",
}

func randomText(r *rand.Rand, n int) string {
	var b strings.Builder
	for range r.IntN(n) {
		b.WriteString(trickyPieces[r.IntN(len(trickyPieces))])
	}
	return b.String()
}

// The built-in scanners agree with the regex engine running the patterns
// they stand for (the regex engine differs from the file format's only in
// case-insensitive matching of U+017F, which the scanners do as the format
// does and the test inputs leave out).
func TestScannersMatchRegexEngine(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, pat := range []string{gpt2Pattern, llama3Pattern, qwen2Pattern} {
		scan := builtinScanner(pat)
		require.NotNil(t, scan)
		tr, err := translateRegex(pat)
		require.NoError(t, err)
		re, err := regexp2.Compile(tr, regexp2.None)
		require.NoError(t, err)
		re.MatchTimeout = matchTimeout
		slow := &regexMatcher{re: re, src: pat}
		for range 3000 {
			s := randomText(r, 30)
			if !assert.Equal(t, collect(t, slow, s), collect(t, scan, s), "%q on %q", pat[:12], s) {
				return
			}
		}
	}
}

// The one case-insensitivity the contractions need: U+017F folds to s.
func TestLlamaContractionsFoldLongS(t *testing.T) {
	m := builtinScanner(llama3Pattern)
	assert.Equal(t, [][2]int{{0, 1}, {1, 4}, {4, 5}}, collect(t, m, "x'\u017fa"))
	assert.Equal(t, [][2]int{{0, 1}, {1, 4}, {4, 5}}, collect(t, m, "x'LLa"))
}

// Empty matches follow the format's iteration rule: one right after a
// match is skipped.
func TestEmptyMatchesIteration(t *testing.T) {
	m, err := compilePattern(false, "a*")
	require.NoError(t, err)
	assert.Equal(t, [][2]int{{0, 0}, {1, 3}, {4, 4}}, collect(t, m, "baab"))
	m, err = compilePattern(true, "")
	require.NoError(t, err)
	assert.Equal(t, [][2]int{{0, 0}, {1, 1}, {3, 3}, {4, 4}}, collect(t, m, "aéb"))
}

func TestSplitBehaviors(t *testing.T) {
	m, err := compilePattern(true, "-")
	require.NoError(t, err)
	for b, want := range map[behavior][]string{
		behRemoved:            {"The", "final", "countdown"},
		behIsolated:           {"The", "-", "final", "-", "-", "countdown"},
		behMergedWithPrevious: {"The-", "final-", "-", "countdown"},
		behMergedWithNext:     {"The", "-final", "-", "-countdown"},
		behContiguous:         {"The", "-", "final", "--", "countdown"},
	} {
		var got []string
		s := "The-final--countdown"
		require.NoError(t, splitWith(s, m, false, b, func(a, e int) error {
			if a < e {
				got = append(got, s[a:e])
			}
			return nil
		}))
		assert.Equal(t, want, got, "behavior %d", b)
	}
}

func TestRegexTranslation(t *testing.T) {
	_, err := compilePattern(false, `[[:alpha:]]`)
	assert.Error(t, err)
	_, err = compilePattern(false, `[\W]`)
	assert.Error(t, err)
	_, err = compilePattern(false, `(unclosed`)
	assert.Error(t, err)
	m, err := compilePattern(false, `\w+`)
	require.NoError(t, err)
	// Outside a class the Latin-1 superscripts count as word characters.
	assert.Equal(t, [][2]int{{0, 4}, {5, 8}}, collect(t, m, "x²y a\u0301"))
	m, err = compilePattern(false, `[\w]+`)
	require.NoError(t, err)
	assert.Equal(t, [][2]int{{0, 1}, {3, 4}}, collect(t, m, "x²y"))
}
