// Package sqlclass classifies SQL text for the rules: each statement's
// kinds and the tables it names. governor-proxy's pgwire side and governor
// explain use it, and package classify takes its kinds of statement from
// it. It may import only the standard library: the lexer and the
// classifier do not depend on the rules.
//
// # A careful lexer, not a parser
//
// The classifier is a hand-written lexer (comments, nested block comments,
// dollar quotes, quoted and U& identifiers, standard, E'...', N'...' and
// bit strings) and a keyword scan over its tokens, not a full parser. A
// full parser (pg_query_go, cgo with libpg_query) would be exact, but costs
// cgo at every call, a C toolchain in every build, and tens of microseconds
// per statement; a pure-Go grammar lags PostgreSQL's. Governance needs a
// kind and the tables, which the statement's leading keyword and a few
// clauses give: FOR UPDATE/SHARE (lock), a data-modifying WITH (its DML
// kinds and not select), EXPLAIN ANALYZE (the explained statement's kinds),
// INSERT ... ON CONFLICT DO UPDATE (also update), SELECT INTO (also ddl),
// DECLARE ... FOR (the query's kinds), COPY (query) (copy and the query's
// writes), PREPARE, EXECUTE, DEALLOCATE and DISCARD ALL (Statement.Op,
// Statement.Execute: the proxy follows them per connection), DO, CALL, and
// calls of functions not known to only read (function). Tables are those
// after FROM, JOIN, INTO, UPDATE, USING, TABLE, COPY, TRUNCATE and LOCK, at
// any depth, CTE names excepted where a CTE can be read (never as the
// target of INSERT, UPDATE, DELETE or MERGE); names are folded and cut to
// 63 bytes as the server does.
//
// Each statement of a text is its own Statement: a Query of several
// statements is matched, and charged, statement by statement. Identical
// statements in a row share one entry with a Count.
//
// Lexing depends on two server settings (Settings): with
// standard_conforming_strings off a backslash escapes in '...' too, and in
// the client encodings SJIS, BIG5, GBK, UHC, GB18030 and JOHAB a backslash
// byte can be the second byte of a character. Lexed with the wrong ones, a
// statement can hide in what looks like a string; the proxy lexes with the
// settings the server reports.
//
// # Read as the server reads it
//
// Where a token ends, and what name an identifier stands for, follow
// PostgreSQL 13 and later (scan.l, and parser.c's filter for UESCAPE);
// testdata/forms.txt holds each form with its classification, and runs it
// on a real server. A -- comment ends at a line feed or a carriage return.
// A string goes on in another quoted body after whitespace holding a
// newline, read as the first one is (after E'a', a backslash escapes in
// the next body too); B'...' and X'...' end at their first quote. In a
// client-only encoding a character is read whole, after a backslash and in
// a dollar quote's tag too. A U&"..." name is decoded (\XXXX, \+XXXXXX,
// surrogate pairs, the character an UESCAPE clause names) and keeps its
// case; an unquoted name folds its ASCII letters and no others, as the
// server folds it in a database of a multibyte encoding such as UTF8. (In a
// database of a single-byte encoding, LATIN1 say, the server also folds the
// letters its locale knows, which the proxy cannot see: there an unquoted
// name with non-ASCII capitals reads with them unfolded.)
//
// Text the server refuses runs nothing, so how it is read cannot let a
// write through: every statement in a Query is parsed before the first
// runs, and a Parse that fails prepares nothing. Such text is still read
// for what its writer most likely meant, not as unknown (which only rules
// naming unknown match): a U& escape the server cannot decode is kept as
// written, the others decoded, so that a write is charged under the rule it
// would fall under if a server did run it.
//
// # Bounded work
//
// Tokens are made one at a time and never stored; frames (the statements
// nested in EXPLAIN, DECLARE, COPY, PREPARE and WITH) and table readers are
// kept one per level, and nothing recurses. So a text classifies in time
// linear in its size and in memory bounded by the limits, not by the text:
// MaxDepth levels of nesting, MaxNames names and MaxStatements entries. A
// statement past a limit is of kind unknown, with no tables, and the text
// after it is classified as usual; a 10 MiB multi-row INSERT is an
// ordinary insert.
//
// # What cannot be seen
//
// The body of a DO block, what a procedure (CALL) or a function does, and
// writes hidden in views, rules and triggers are not seen: the statement
// is do, call or function (a SELECT calling a function has both select and
// function), never more. Built-ins known only to read (count, now, lower,
// generate_series, ...) are not function calls; a function of the same
// name earlier in search_path is taken for the built-in. An EXECUTE runs
// whatever the connection prepared under its name; a name prepared where
// the proxy could not see (dynamic SQL in a DO block) makes it unknown.
//
// Measured on the development machine (go test -bench Classify): 0.7 to
// 1 µs and 3 allocations for pgbench's statements, 2.5 to 3.6 µs for a
// 200-byte join or a data-modifying WITH; through the cache
// (BenchmarkClassifyCached), 57 ns and no allocation; 10 MiB of multi-row
// INSERT in about 50 ms. Cache is a bounded LRU by settings and statement
// text (texts over 8 KiB are not kept).
package sqlclass
