package sqlclass

import (
	"container/list"
	"sync"
)

// Bounds of a Cache.
const (
	// DefaultCacheEntries is how many distinct statement texts the cache
	// keeps, least recently used first out.
	DefaultCacheEntries = 4096
	// maxCachedText: longer texts (typically bulk INSERTs with literal
	// values, each one different) are classified every time, not kept.
	maxCachedText = 8 << 10
)

// Cache is a bounded LRU of statement text, lexed under given Settings, to
// Class; safe for concurrent use: a proxy's connections share one.
type Cache struct {
	mu  sync.Mutex
	max int
	m   map[Settings]map[string]*list.Element
	l   list.List // of *cacheEntry, most recent first
}

type cacheEntry struct {
	set   Settings
	sql   string
	class *Class
}

// NewCache returns a Cache of max entries; 0 means DefaultCacheEntries.
func NewCache(max int) *Cache {
	if max <= 0 {
		max = DefaultCacheEntries
	}
	return &Cache{max: max, m: make(map[Settings]map[string]*list.Element)}
}

// ClassifyBytes is Classify for text in a buffer: a text found in the cache
// costs no allocation.
func (c *Cache) ClassifyBytes(sql []byte, s Settings) *Class {
	if len(sql) <= maxCachedText {
		c.mu.Lock()
		if e, ok := c.m[s][string(sql)]; ok {
			c.l.MoveToFront(e)
			cl := e.Value.(*cacheEntry).class
			c.mu.Unlock()
			return cl
		}
		c.mu.Unlock()
	}
	return c.Classify(string(sql), s)
}

// Classify returns the Class of sql lexed under s, from the cache when it
// is there.
func (c *Cache) Classify(sql string, s Settings) *Class {
	if len(sql) > maxCachedText {
		return ClassifyWith(sql, s)
	}
	c.mu.Lock()
	if e, ok := c.m[s][sql]; ok {
		c.l.MoveToFront(e)
		cl := e.Value.(*cacheEntry).class
		c.mu.Unlock()
		return cl
	}
	c.mu.Unlock()
	cl := ClassifyWith(sql, s)
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.m[s]
	if m == nil {
		m = make(map[string]*list.Element)
		c.m[s] = m
	}
	if _, ok := m[sql]; !ok {
		m[sql] = c.l.PushFront(&cacheEntry{set: s, sql: sql, class: cl})
		for c.l.Len() > c.max {
			old := c.l.Back()
			c.l.Remove(old)
			oe := old.Value.(*cacheEntry)
			delete(c.m[oe.set], oe.sql)
		}
	}
	return cl
}
