// Package sqlclass classifies SQL text for the rules: the statement kinds
// and the tables it names. governor-proxy's pgwire side and governor
// explain use it. It may import the standard library and classify.
//
// # A careful lexer, not a parser
//
// The classifier is a hand-written lexer (comments, nested block
// comments, dollar quotes, quoted and U& identifiers, standard and E'...'
// strings) and a keyword scan over its tokens, not a full parser. A full
// parser (pg_query_go, cgo with libpg_query) would be exact, but costs cgo
// at every call, a C toolchain in every build, and tens of microseconds per
// statement; a pure-Go grammar lags PostgreSQL's. Governance needs a kind
// and the tables, which the statement's leading keyword and a few clauses
// give: FOR UPDATE/SHARE (lock), a data-modifying WITH (its DML kinds and
// not select), EXPLAIN ANALYZE (the explained statement's kinds), DO, CALL,
// INSERT ... ON CONFLICT DO UPDATE (also update), SELECT INTO (also ddl),
// DECLARE ... CURSOR FOR (the query's kinds), SQL-level PREPARE/EXECUTE
// (followed per connection). A Query or Parse holding several statements
// gets the union. Tables are those after FROM, JOIN, INTO, UPDATE, USING,
// TABLE, COPY, TRUNCATE and LOCK, at any depth, CTE names excepted.
// Known limits: a function call that writes (SELECT nextval(...),
// SELECT my_writing_function()) is a select, as are writes hidden in
// views, rules and triggers.
//
// Measured on the development machine (BenchmarkClassifySQL, go test
// -bench Classify): 1.4 to 2 µs and 6 allocations for pgbench's statements,
// 4 to 8 µs for a 200-byte join or a data-modifying WITH; through the cache
// (BenchmarkClassifyCached), 35 ns and no allocation. Cache is a bounded
// LRU by statement text (texts over 8 KiB are not kept).
package sqlclass
