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
//
// Layout: one file per component, named by its stage and type
// (model_bpe.go, normalizer_bert.go, pretokenizer_metaspace.go,
// postprocessor_template.go, decoder_bytefallback.go, ...), holding its
// parser beside its behaviour; <stage>.go holds the stage's interface and
// Sequence, config.go the file's top level and the dispatch by "type".
//
// Why it is written here rather than bound to a library: the frontend
// must tokenize exactly as the served model's `tokenizers` does, and
// neither way to do that from Go was exact; both were also slower.
// Measured 2026-12-05 (go1.26.8, a shared 2-core AMD EPYC) by a scratch
// module outside the repository that runs each library on this package's
// vectors (testdata/*/cases.json: 24 files, 3,503 texts; a text counts
// when Encode with and without special tokens and Decode all equal
// `tokenizers` 0.23.3) and on prompt.txt of testdata/bench, best of 3
// testing.Benchmark runs, ids checked against `tokenizers`:
//
//	                        this package  daulet/tokenizers  sugarme/tokenizer
//	                                      v1.24.0, cgo+Rust  v0.3.0, pure Go
//	files loaded, of 24     24            24                 18
//	texts exact, of 3,503   3,503         3,334              1,412
//	testdata/bench (Llama-3 style, 16k vocabulary), 3,996 ids:
//	  encode                271 us        2,366 us           cannot load it
//	  decode                118 us        432 us             -
//	testdata/gpt2 (GPT-2 style, 520 tokens), 9,835 ids:
//	  encode                343 us        3,280 us           26,242 us, wrong
//	testdata/wordpiece (BERT style, 533 tokens), 5,987 ids:
//	  encode                1,292 us      5,997 us           30,045 us, wrong
//
// github.com/daulet/tokenizers binds Hugging Face's Rust crate through
// cgo. It misses 167 texts that hold a NUL (it passes text as a C string,
// which ends there) and 2 decodes where the crate it pins (0.22) differs
// from 0.23. Its Rust library must be built with cargo for every target of
// the wheel, or fetched prebuilt from the binding's GitHub releases; here
// it was built (2m51s, 142 crates, a 50 MB static library, once its one
// git-only dependency, tiktoken-rs, was taken from the Rust package index instead), and
// a minimal program linking it grows from 2.8 to 17.9 MB stripped. Every
// call crosses cgo and copies the text in and the ids out, and the Rust
// allocator's memory is outside the Go runtime's view (GOMEMLIMIT, heap
// profiles; the benchmark sees 3 Go allocations per encode, nothing of
// Rust's).
//
// github.com/sugarme/tokenizer panics compiling the lookahead of the
// Llama-3 and Qwen2 split pattern (3 of the files) and a Split lookbehind,
// has no BPEDecoder, and refuses the merges of a BPE with a
// continuing_subword_prefix. On the files it loads it panics on 275 texts
// (Metaspace, truncation and padding, Split), its ids differ from the
// reference ("wrong" above: the GPT-2 style prompt from token 1,297), and
// it allocates 250,000 to 460,000 times per encode of those prompts.
//
// Against Python's `tokenizers` itself, as the worker would run it, see
// docs/benchmarks.md, "Tokenization".
package tokenizer
