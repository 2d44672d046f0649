package pgwire

import (
	"container/list"
	"sync"
)

// Bounds of the statement cache shared by a Proxy's connections.
const (
	// DefaultCacheEntries is how many distinct statement texts the cache
	// keeps, least recently used first out.
	DefaultCacheEntries = 4096
	// maxCachedText: longer texts (typically bulk INSERTs with literal
	// values, each one different) are classified every time, not kept.
	maxCachedText = 8 << 10
)

// classCache is a bounded LRU of statement text to Class.
type classCache struct {
	mu  sync.Mutex
	max int
	m   map[string]*list.Element
	l   list.List // of *cacheEntry, most recent first
}

type cacheEntry struct {
	sql   string
	class *Class
}

func newClassCache(max int) *classCache {
	if max <= 0 {
		max = DefaultCacheEntries
	}
	return &classCache{max: max, m: make(map[string]*list.Element)}
}

// classify returns the Class of sql, from the cache when it is there.
func (c *classCache) classify(sql string) *Class {
	if len(sql) > maxCachedText {
		return ClassifySQL(sql)
	}
	c.mu.Lock()
	if e, ok := c.m[sql]; ok {
		c.l.MoveToFront(e)
		cl := e.Value.(*cacheEntry).class
		c.mu.Unlock()
		return cl
	}
	c.mu.Unlock()
	cl := ClassifySQL(sql)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[sql]; !ok {
		c.m[sql] = c.l.PushFront(&cacheEntry{sql: sql, class: cl})
		for c.l.Len() > c.max {
			old := c.l.Back()
			c.l.Remove(old)
			delete(c.m, old.Value.(*cacheEntry).sql)
		}
	}
	return cl
}
