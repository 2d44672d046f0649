package sqlclass

import "strings"

// scanTables records the tables that toks[start:end] names: after FROM,
// JOIN, INTO, UPDATE ... SET, USING (in DML), TABLE, COPY, TRUNCATE, LOCK,
// and ON in CREATE INDEX/TRIGGER/POLICY and GRANT/REVOKE. CTE names are
// left out. It walks every token, so subqueries at any depth count.
func (c *classifier) scanTables(start, end int, k kindSet) {
	first := c.at(start)
	// openers[d] is the token before the '(' that opened depth d+1, so that
	// FROM inside extract(... FROM ...) is not taken for a table.
	var openers []token
	ddl := k&kDDL != 0 && !first.is("select")
	onIntro := first.is("grant") || first.is("revoke")
	if first.is("create") {
		for i := start + 1; i < end && i < start+6; i++ {
			if t := c.toks[i]; t.is("index") || t.is("trigger") || t.is("policy") || t.is("rule") || t.is("statistics") {
				onIntro = true
			}
		}
	}
	for i := start; i < end; i++ {
		t := c.toks[i]
		switch t.kind {
		case tokLParen:
			openers = append(openers, c.at(i-1))
			continue
		case tokRParen:
			if len(openers) > 0 {
				openers = openers[:len(openers)-1]
			}
			continue
		case tokIdent:
		default:
			continue
		}
		switch t.text {
		case "from":
			if len(openers) == 0 && first.is("copy") {
				continue
			}
			if len(openers) > 0 && isFromFunction(openers[len(openers)-1]) {
				continue
			}
			if c.at(i - 1).is("distinct") {
				continue
			}
			c.tableList(i+1, end, true)
		case "join":
			c.tableList(i+1, end, true)
		case "into":
			j := i + 1
			for c.at(j).is("temporary") || c.at(j).is("temp") || c.at(j).is("unlogged") || c.at(j).is("table") {
				j++
			}
			c.tableName(j, end)
		case "update":
			// UPDATE [ONLY] name [*] [[AS] alias] SET; not FOR UPDATE, ON
			// UPDATE, DO UPDATE SET, THEN UPDATE SET.
			j := i + 1
			if c.at(j).is("only") {
				j++
			}
			name, next := c.name(j, end)
			if name == "" {
				continue
			}
			if c.at(next).kind == tokOp {
				next++
			}
			if c.at(next).is("as") {
				next++
			}
			if !c.at(next).is("set") {
				next++
			}
			if c.at(next).is("set") {
				c.addTable(name)
			}
		case "using":
			if !ddl && !c.at(i-1).is("index") {
				c.tableList(i+1, end, true)
			}
		case "table":
			j := i + 1
			if c.at(j).is("if") {
				j++
				if c.at(j).is("not") {
					j++
				}
				if c.at(j).is("exists") {
					j++
				}
			}
			c.tableList(j, end, false)
		case "copy", "truncate", "lock":
			if i != start {
				continue
			}
			j := i + 1
			if c.at(j).is("table") {
				continue // handled by "table"
			}
			if c.at(j).kind != tokLParen {
				c.tableList(j, end, false)
			}
		case "on":
			if onIntro && len(openers) == 0 && !c.at(i+1).is("table") && !isObjectKeyword(c.at(i+1)) {
				c.tableList(i+1, end, false)
			}
		}
	}
}

// isFromFunction: SQL functions whose arguments use FROM.
func isFromFunction(t token) bool {
	if t.kind != tokIdent {
		return false
	}
	switch t.text {
	case "extract", "substring", "trim", "overlay", "position":
		return true
	}
	return false
}

// isObjectKeyword: what may follow GRANT ... ON besides a table.
func isObjectKeyword(t token) bool {
	if t.kind != tokIdent {
		return false
	}
	switch t.text {
	case "all", "schema", "database", "function", "procedure", "routine", "sequence", "foreign",
		"language", "large", "type", "domain", "tablespace", "parameter", "conflict":
		return true
	}
	return false
}

// tableList reads one or more comma-separated table references starting at
// i. In a FROM list (from), a name followed by "(" is a function, not a
// table, and aliases are skipped.
func (c *classifier) tableList(i, end int, from bool) {
	for i < end {
		for c.at(i).is("only") || c.at(i).is("lateral") {
			i++
		}
		if c.at(i).kind == tokLParen {
			if !from {
				return
			}
			i = matchParen(c.toks, i, end) + 1 // a subquery; its tables are scanned on their own
		} else {
			name, next := c.name(i, end)
			if name == "" {
				return
			}
			if from && c.at(next).kind == tokLParen {
				// a function in FROM; skip its arguments
				i = matchParen(c.toks, next, end) + 1
			} else {
				c.addTable(name)
				i = next
			}
		}
		if c.at(i).kind == tokOp { // ONLY name *
			i++
		}
		if from {
			if c.at(i).is("as") {
				i++
			}
			if t := c.at(i); (t.kind == tokIdent && !isReserved(t.text)) || t.kind == tokQIdent {
				i++
				if c.at(i).kind == tokLParen {
					i = matchParen(c.toks, i, end) + 1
				}
			}
		}
		if c.at(i).kind != tokComma {
			return
		}
		i++
	}
}

// tableName reads one table name at i.
func (c *classifier) tableName(i, end int) {
	if name, _ := c.name(i, end); name != "" {
		c.addTable(name)
	}
}

// name reads a possibly qualified name (a.b or a.b.c) at i and returns it
// and the index after it; "" when there is none there.
func (c *classifier) name(i, end int) (string, int) {
	t := c.at(i)
	if i >= end || !(t.kind == tokQIdent || (t.kind == tokIdent && !isReserved(t.text))) {
		return "", i
	}
	name := t.text
	i++
	for c.at(i).kind == tokDot && i+1 < end {
		n := c.at(i + 1)
		if n.kind != tokIdent && n.kind != tokQIdent {
			break
		}
		name += "." + n.text
		i += 2
	}
	return name, i
}

func (c *classifier) addTable(name string) {
	if !strings.Contains(name, ".") {
		for _, cte := range c.ctes {
			if cte == name {
				return
			}
		}
	}
	for _, t := range c.tables {
		if t == name {
			return
		}
	}
	c.tables = append(c.tables, name)
}

// isReserved lists the keywords that end a table reference or cannot be a
// table name where this package looks for one.
func isReserved(s string) bool {
	switch s {
	case "where", "join", "inner", "left", "right", "full", "outer", "cross", "natural", "on", "using",
		"group", "order", "limit", "offset", "having", "window", "union", "intersect", "except", "for",
		"returning", "set", "fetch", "into", "values", "tablesample", "lateral", "when", "then", "else",
		"select", "from", "as", "and", "or", "not", "default", "do", "with", "to", "only", "nowait",
		"skip", "in", "is", "null", "true", "false", "case", "end", "all", "distinct", "by", "overriding",
		"stdin", "stdout", "cascade", "restrict", "if", "exists", "partition", "of", "table", "matched",
		"insert", "update", "delete", "merge", "nothing", "conflict", "array", "row":
		return true
	}
	return false
}
