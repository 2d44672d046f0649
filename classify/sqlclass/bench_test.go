package sqlclass

import (
	"fmt"
	"testing"
)

var benchSQL = []string{
	"SELECT abalance FROM pgbench_accounts WHERE aid = $1",
	"UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2",
	"INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)",
	"WITH moved AS (DELETE FROM queue WHERE id IN (SELECT id FROM queue ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING *) INSERT INTO done SELECT * FROM moved",
	"SELECT o.id, c.name, sum(l.amount) FROM orders o JOIN customers c ON c.id = o.customer_id LEFT JOIN lines l ON l.order_id = o.id WHERE o.created > now() - interval '1 day' AND c.name <> 'it''s' GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 50",
}

// BenchmarkClassify is the classifier's cost per statement, uncached.
func BenchmarkClassify(b *testing.B) {
	for i, sql := range benchSQL {
		b.Run(fmt.Sprint(i), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Classify(sql)
			}
		})
	}
}

// BenchmarkClassifyCached is the cost per statement through the cache.
func BenchmarkClassifyCached(b *testing.B) {
	c := NewCache(0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Classify(benchSQL[i%len(benchSQL)], Settings{})
		i++
	}
}
