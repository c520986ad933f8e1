package tokenizer

import (
	"hash/maphash"
	"sync"
)

// Words at least this long (in bytes) are not cached.
const maxCachedWord = 256

const (
	cacheShards        = 32
	cacheShardCapacity = 512 // words per shard: 16384 in all
)

// wordCache is a bounded, concurrency-safe cache of per-word results. A
// shard that fills up is emptied and refilled, which keeps the cache
// bounded and adaptive without bookkeeping on hits.
type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]int
}

func newWordCache() *wordCache { return &wordCache{seed: maphash.MakeSeed()} }

func (c *wordCache) get(w []byte) ([]int, bool) {
	sh := &c.shards[maphash.Bytes(c.seed, w)%cacheShards]
	sh.mu.RLock()
	ids, ok := sh.m[string(w)]
	sh.mu.RUnlock()
	return ids, ok
}

// put stores ids for w; ids must not be modified afterwards. w must not
// share memory with a larger string (it would be retained).
func (c *wordCache) put(w string, ids []int) {
	sh := &c.shards[maphash.String(c.seed, w)%cacheShards]
	sh.mu.Lock()
	if sh.m == nil || len(sh.m) >= cacheShardCapacity {
		sh.m = make(map[string][]int, cacheShardCapacity)
	}
	sh.m[w] = ids
	sh.mu.Unlock()
}
