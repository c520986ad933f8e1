package frontend

// Detokenize is the frontend's stand-in detokenizer, for tests that check the
// text a request produced.
var Detokenize = detokenize
