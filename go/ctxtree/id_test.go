package ctxtree

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The id rule at each of its boundaries (docs/design.md, section 9): length
// in bytes, UTF-8, printable runes.
func TestValidateID(t *testing.T) {
	for _, id := range []string{
		"a", "req-42", "with space", "~!@#$%^&*()_+{}|:<>?", "réq-日本-🙂",
		strings.Repeat("x", MaxIDLen),   // the longest
		strings.Repeat("é", MaxIDLen/2), // the longest, in 2-byte runes
		strings.Repeat("🙂", MaxIDLen/4), // and 4-byte ones
		strings.Repeat("x", MaxIDLen-1) + "y",
		NewID(),
	} {
		assert.NoError(t, ValidateID(id), "id %q", id)
	}
	for id, why := range map[string]string{
		"":                                    "it is empty",
		strings.Repeat("x", MaxIDLen+1):       "it is 257 bytes long",
		strings.Repeat("é", MaxIDLen/2+1):     "it is 258 bytes long",
		strings.Repeat("x", MaxIDLen-1) + "é": "it is 257 bytes long", // 256 runes, 257 bytes
		"\xff":                                "not valid UTF-8",
		"\xc0\xaf":                            "not valid UTF-8", // overlong
		"\xed\xa0\x80":                        "not valid UTF-8", // a UTF-16 surrogate
		"日"[:2]:                               "not valid UTF-8", // truncated
		"a\x00b":                              "U+0000 at byte 1",
		"a\tb":                                "U+0009 at byte 1",
		"a\nb":                                "U+000A at byte 1",
		"\x7f":                                "U+007F at byte 0",
		"a\u0085b":                            "U+0085 at byte 1", // a C1 control
		"a\u00a0b":                            "U+00A0 at byte 1", // no-break space
		"é\u200bb":                            "U+200B at byte 2", // zero width space, a format character
		"a\u2028b":                            "U+2028 at byte 1", // line separator
	} {
		err := ValidateID(id)
		require.ErrorIs(t, err, ErrInvalidID, "id %q", id)
		assert.Contains(t, err.Error(), why, "id %q", id)
		assert.Contains(t, err.Error(), IDRule, "id %q: the message states the rule", id)
	}
}

func TestIDRuleStatesMaxIDLen(t *testing.T) {
	assert.Contains(t, IDRule, "1 to "+strconv.Itoa(MaxIDLen)+" bytes")
}

func TestValidateIDAllocatesNothingForAValidID(t *testing.T) {
	id := strings.Repeat("réq-", 16)
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = ValidateID(id) }))
}
