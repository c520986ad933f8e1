//go:build race

package tokenizer

// The race detector slows encoding about tenfold: the hostile-input test
// then uses 1 MiB inputs instead of 4 MiB.
const hostileSize = 1 << 20
