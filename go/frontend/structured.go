package frontend

// Structured output: OpenAI's response_format (json_object, json_schema) and
// vLLM's structured_outputs extension (json, json_object, regex, choice,
// grammar), sent to the engine as the engine parameter structured_outputs
// (vLLM's StructuredOutputsParams by its field names) when the model's
// cards list it, else refused (extensions.go).

import (
	"encoding/json"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// responseFormat is OpenAI's response_format.
type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	} `json:"json_schema"`
}

// structuredOutputs is vLLM's structured_outputs request field.
type structuredOutputs struct {
	JSON       json.RawMessage `json:"json"`
	JSONObject *bool           `json:"json_object"`
	Regex      *string         `json:"regex"`
	Choice     []string        `json:"choice"`
	Grammar    *string         `json:"grammar"`
}

// structured is what the request asks of the engine's structured output
// (nil: nothing), and the request field that asked it.
func structured(req *completionRequest) (map[string]any, string, error) {
	out := map[string]any{}
	from := "structured_outputs"
	if so := req.StructuredOutputs; so != nil {
		n := 0
		if !jsonscan.IsNull(so.JSON) {
			t := jsonscan.Trim(so.JSON)
			if t[0] != '{' && t[0] != '"' {
				return nil, from, invalid(from, "invalid_structured_outputs", "structured_outputs.json must be a JSON schema (an object or its text)")
			}
			out["json"], n = json.RawMessage(t), n+1
		}
		if so.JSONObject != nil && *so.JSONObject {
			out["json_object"], n = true, n+1
		}
		if so.Regex != nil {
			out["regex"], n = *so.Regex, n+1
		}
		if len(so.Choice) > 0 {
			out["choice"], n = so.Choice, n+1
		}
		if so.Grammar != nil {
			out["grammar"], n = *so.Grammar, n+1
		}
		if n > 1 {
			return nil, from, invalid(from, "invalid_structured_outputs", "structured_outputs may ask one kind of constraint only")
		}
	}
	if rf := req.ResponseFormat; rf != nil && rf.Type != "" && rf.Type != "text" {
		from = "response_format"
		switch rf.Type {
		case "json_object":
			out = map[string]any{"json_object": true}
		case "json_schema":
			if rf.JSONSchema == nil || jsonscan.IsNull(rf.JSONSchema.Schema) || jsonscan.Trim(rf.JSONSchema.Schema)[0] != '{' {
				return nil, from, invalid(from, "invalid_response_format", "response_format json_schema needs json_schema.schema, a JSON schema object")
			}
			out = map[string]any{"json": json.RawMessage(jsonscan.Trim(rf.JSONSchema.Schema))}
		default:
			return nil, from, unsupported(from, "response_format "+rf.Type)
		}
	}
	if len(out) == 0 {
		return nil, from, nil
	}
	return out, from, nil
}
