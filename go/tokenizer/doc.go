// Package tokenizer encodes and decodes text with a Hugging Face
// tokenizer.json, in pure Go.
//
// Exactness: Encode and Decode give the ids and the text the reference
// Python `tokenizers` package (0.23) gives for the same file; the tests
// require equality, token for token, on vectors it generated
// (testdata/gen.py) for every family below, adversarial inputs included.
// The known limits: character classes and Unicode normalization use Go's
// Unicode 15.0 tables (characters assigned since may be classified
// differently); a Regex pattern other than the built-in ones below runs on
// a backtracking engine whose case-insensitive matching differs for a few
// characters (such as U+017F), and a pattern using POSIX brackets, class
// intersections or \W inside a class is refused; and
// Metaspace's prepend_scheme "first" decides what starts the input from
// the piece's position, which can differ from the format's offsets after
// unusual normalizer and pre-tokenizer combinations.
//
// Supported:
//   - models: BPE (byte_fallback, fuse_unk, ignore_merges, unk_token,
//     continuing_subword_prefix, end_of_word_suffix, both spellings of
//     merges), WordLevel, WordPiece, Unigram;
//   - normalizers: NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents,
//     Replace, Prepend, Nmt, ByteLevel, BertNormalizer, Sequence;
//   - pre-tokenizers: ByteLevel, Split (String and Regex patterns, every
//     behavior, invert), Metaspace, Whitespace, WhitespaceSplit, Digits,
//     Punctuation, BertPreTokenizer, CharDelimiterSplit, FixedLength,
//     Sequence;
//   - post-processors (single sequences): TemplateProcessing, ByteLevel,
//     BertProcessing, RobertaProcessing, Sequence; the file's truncation
//     and padding settings apply as in `tokenizers`;
//   - decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
//     WordPiece, BPEDecoder, CTC, Sequence;
//   - added tokens with special, single_word, lstrip, rstrip and
//     normalized (non-normalized ones are matched on the raw text, the
//     others after normalization; leftmost, then longest), always matched
//     as single tokens.
//
// Refused: any other component type (e.g. the Precompiled normalizer,
// the UnicodeScripts pre-tokenizer), components without a "type" (but a
// BPE model recognised by its merges), BPE dropout other than 0, and a
// single-sequence template that uses $B. FromJSON fails with an error that
// names what it refuses: the package never tokenizes with part of a file
// it does not implement.
//
// Text that is not valid UTF-8 is read as if each maximal invalid
// sequence were U+FFFD (the Unicode recommended practice).
//
// Concurrency: a *Tokenizer is immutable once built and safe for use by
// any number of goroutines; its only shared mutable state is the model's
// bounded per-word cache (16384 words, under sharded locks). A StreamDecoder
// belongs to one stream.
//
// Bounds: the pre-tokenization patterns of the GPT-2, Llama-3 and Qwen2
// families run on built-in scanners, exact and linear in time, and so do
// all other stages but BPE merging, which is O(n log n) in the length of a
// word. A multi-megabyte input (one huge word, a run of spaces) encodes in
// about a second and in memory proportional to its length. Any other
// regex runs on a backtracking engine with a per-match timeout; past it,
// Encode returns an error.
package tokenizer
