//go:build !race

package tokenizer

const hostileSize = 4 << 20
