// Package modelcard is the contract between a worker and the frontends: the
// card a worker publishes with its instance (the instance's metadata in
// discovery). It says which model the instance serves, in which mode, with
// which migration limit, capacity and context length, and which model
// directory holds the model's text (its tokenizer and chat template), named
// by its path and by the checksum of its text files.
//
// The card is defined here and nowhere else:
//
//   - the Python worker builds its card through the native library
//     (dc_model_card, _native.model_card), which calls Build: Go validates it
//     and reads the directory's text files for the checksum;
//   - the frontend (go/frontend) and go/cmd/scalesim read and write it with
//     this package's types.
//
// The text checksum is what makes a model's text safe to cache: a frontend
// keys the text it loads by it, so a directory updated in place (a new
// revision at the same path) or two workers with different files at one path
// (on different machines) are never served each other's text.
package modelcard

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/reasoning"
	"github.com/dynamo-ctx/dynamo-ctx/go/toolcall"
)

// Mode is what an instance does with a request.
type Mode string

// The modes a worker runs in.
const (
	// Agg is a worker that prefills and decodes (aggregated).
	Agg Mode = "agg"
	// Prefill is a worker that only prefills, for a decode worker.
	Prefill Mode = "prefill"
	// Decode is a worker that decodes after asking a prefill worker.
	Decode Mode = "decode"
)

// Modes are the modes a card may name.
var Modes = []Mode{Agg, Prefill, Decode}

// MaxBytes bounds a card's JSON encoding.
const MaxBytes = 16 << 10

// ErrInvalid is what every error of Validate wraps: the card breaks a rule
// (rather than its model directory being unreadable).
var ErrInvalid = errors.New("invalid model card")

// ChecksumPrefix starts every text checksum: the hash it is written with.
const ChecksumPrefix = "sha256:"

// Card is what a worker publishes with its instance. The JSON names are the
// wire format frontends read; fields left at zero are left out (but
// migration_limit, always written).
type Card struct {
	// Model is the name clients use (--served-model-name, else --model).
	Model string `json:"model"`
	// Mode is what the instance does (Modes).
	Mode Mode `json:"mode,omitempty"`
	// MigrationLimit is how many times a broken stream of the model may be
	// continued on another worker.
	MigrationLimit int `json:"migration_limit"`
	// MaxNumSeqs is the instance's capacity: the requests its engine runs
	// at once (0: no limit).
	MaxNumSeqs int `json:"max_num_seqs,omitempty"`
	// MaxModelLen is the model's context length, prompt and output tokens
	// (0: not declared).
	MaxModelLen int `json:"max_model_len,omitempty"`
	// ModelPath is the absolute path of the model directory (Hugging Face
	// layout) whose text the frontend speaks for this instance ("": the
	// frontend's stand-in text).
	ModelPath string `json:"model_path,omitempty"`
	// TextChecksum is the checksum of ModelPath's text files as the worker
	// read them (Checksum); set exactly when ModelPath is.
	TextChecksum string `json:"text_checksum,omitempty"`
	// Supports are the engine parameters (EngineParams) the instance's
	// engine honours; a frontend refuses a request that asks it another.
	Supports []string `json:"supports,omitempty"`
	// ToolCallParser names the parser (toolcall.Names: vLLM's
	// --tool-call-parser names) that reads tool calls in the model's output;
	// "": none, and tool_choice other than "none" is refused.
	ToolCallParser string `json:"tool_call_parser,omitempty"`
	// ReasoningParser names the parser (reasoning.Names: vLLM's
	// --reasoning-parser names) that splits the model's reasoning from its
	// content in chat responses; "": none.
	ReasoningParser string `json:"reasoning_parser,omitempty"`
}

// BaseParams are the sampling parameters every engine takes, in a token
// request's sampling_options: OpenAI's own.
var BaseParams = []string{"seed", "temperature", "top_p", "presence_penalty", "frequency_penalty"}

// EngineParams are the parameters a request may ask of an engine besides
// BaseParams and its stop conditions (vLLM's extensions of the OpenAI API,
// SamplingParams by name, in a token request's sampling_options). An engine
// honours them or not; its card says which (Supports).
var EngineParams = []string{
	"top_k", "min_p", "repetition_penalty", "min_tokens", "logit_bias", "allowed_token_ids", "bad_words",
	// structured_outputs: output constrained to a JSON schema, any JSON
	// object, a regular expression, a choice or a grammar (vLLM's
	// StructuredOutputsParams by its field names; the OpenAI API's
	// response_format asks it).
	"structured_outputs",
	// logprobs: each output token's log probability and this many
	// candidates at its position (SamplingParams.logprobs).
	"logprobs",
	// prompt_logprobs: the same for the prompt's tokens (the completions
	// API's echo with logprobs; SamplingParams.prompt_logprobs).
	"prompt_logprobs",
}

// Honours reports whether c's engine honours the engine parameter name.
func (c Card) Honours(name string) bool { return slices.Contains(c.Supports, name) }

// Parse reads a card from an instance's metadata. It is lenient, as a
// reader of other versions' cards must be: unknown keys are ignored, and a
// value of the wrong type leaves its field at zero (and is the error).
func Parse(b []byte) (Card, error) {
	var c Card
	err := json.Unmarshal(b, &c)
	return c, err
}

// Validate reports what makes c a card no worker may publish: no model, an
// unknown mode, a negative number, a relative model path, a model path
// without its checksum (or a checksum without a path, or not one Checksum
// writes), or an encoding larger than MaxBytes.
func (c Card) Validate() error {
	var bad []string
	if c.Model == "" {
		bad = append(bad, "the model name must not be empty")
	}
	if !c.Mode.valid() {
		bad = append(bad, fmt.Sprintf("mode %q is not one of %s", c.Mode, modeList()))
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"migration_limit", c.MigrationLimit}, {"max_num_seqs", c.MaxNumSeqs}, {"max_model_len", c.MaxModelLen}} {
		if n.v < 0 {
			bad = append(bad, fmt.Sprintf("%s must be 0 or more, got %d", n.name, n.v))
		}
	}
	switch {
	case c.ModelPath != "" && !filepath.IsAbs(c.ModelPath):
		bad = append(bad, fmt.Sprintf("model_path %q must be absolute", c.ModelPath))
	case c.ModelPath != "" && !validChecksum(c.TextChecksum):
		bad = append(bad, fmt.Sprintf("model_path %q needs the checksum of its text files, got %q", c.ModelPath, c.TextChecksum))
	case c.ModelPath == "" && c.TextChecksum != "":
		bad = append(bad, "a text checksum without a model_path")
	}
	seen := map[string]bool{}
	for _, p := range c.Supports {
		if !slices.Contains(EngineParams, p) || seen[p] {
			bad = append(bad, fmt.Sprintf("supports %q is not one of %s once", p, strings.Join(EngineParams, ", ")))
		}
		seen[p] = true
	}
	if c.ToolCallParser != "" && !slices.Contains(toolcall.Names(), c.ToolCallParser) {
		bad = append(bad, fmt.Sprintf("tool_call_parser %q is not one of %s", c.ToolCallParser, strings.Join(toolcall.Names(), ", ")))
	}
	if c.ReasoningParser != "" && !slices.Contains(reasoning.Names(), c.ReasoningParser) {
		bad = append(bad, fmt.Sprintf("reasoning_parser %q is not one of %s", c.ReasoningParser, strings.Join(reasoning.Names(), ", ")))
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(bad, "; "))
	}
	if b, _ := json.Marshal(c); len(b) > MaxBytes {
		return fmt.Errorf("%w: %d bytes, more than the %d allowed", ErrInvalid, len(b), MaxBytes)
	}
	return nil
}

// JSON is c's encoding, once Validate accepts it.
func (c Card) JSON() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(c)
}

// Build is the card a worker publishes: c with, when it names a model
// directory, the checksum of the directory's text files read now (each
// within go/hfmodel's bound); its JSON, or why it is not a card (Validate,
// or the directory's error). c's own TextChecksum is ignored.
func Build(c Card) (Card, []byte, error) {
	c.TextChecksum = ""
	if c.ModelPath != "" && filepath.IsAbs(c.ModelPath) {
		files, err := hfmodel.ReadDir(c.ModelPath)
		if err != nil {
			return Card{}, nil, fmt.Errorf("the text files of model directory %s: %w", c.ModelPath, err)
		}
		c.TextChecksum = Checksum(files)
	}
	b, err := c.JSON()
	if err != nil {
		return Card{}, nil, err
	}
	return c, b, nil
}

// Checksum is the checksum of a model directory's text files (a subset of
// hfmodel.TextFiles): ChecksumPrefix and the hex SHA-256 of, for each file
// present in TextFiles' order, its name, a NUL, its length (8 bytes, big
// endian) and its bytes. Equal files give equal checksums wherever they are
// read (a worker's disk, a frontend's, over the request plane).
func Checksum(files hfmodel.Files) string {
	h := sha256.New()
	for _, name := range hfmodel.TextFiles {
		b, ok := files[name]
		if !ok {
			continue
		}
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write([]byte(name))
		h.Write([]byte{0})
		h.Write(n[:])
		h.Write(b)
	}
	return ChecksumPrefix + hex.EncodeToString(h.Sum(nil))
}

// validChecksum reports whether s is a checksum Checksum writes.
func validChecksum(s string) bool {
	digest, ok := strings.CutPrefix(s, ChecksumPrefix)
	if !ok || len(digest) != 2*sha256.Size {
		return false
	}
	for _, r := range digest {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

func (m Mode) valid() bool { return slices.Contains(Modes, m) }

func modeList() string {
	names := make([]string, len(Modes))
	for i, m := range Modes {
		names[i] = string(m)
	}
	return strings.Join(names, ", ")
}
