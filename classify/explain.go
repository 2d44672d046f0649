package classify

// Step is one rule's verdict in an explanation.
type Step struct {
	Rule    string
	Matched bool
	// Reason says why: for a rule that did not match, the first field that
	// failed and how (e.g. `match.method: "GET" is not POST`); for the rule
	// that matched, which fields it checked.
	Reason string
}

// ExplainHTTP walks the rules in order as MatchHTTP does and says, for each
// rule up to and including the first match, whether it matched and why. No
// step has Matched set when no rule matches. The same code decides as in
// MatchHTTP, so an explanation cannot disagree with a match.
func (rs *Rules) ExplainHTTP(req HTTPRequest) []Step {
	q := normalizeHTTP(&req)
	return rs.explain(func(r *rule) (bool, string) { return r.matchHTTP(&q, true) })
}

// ExplainSQL is ExplainHTTP for a SQL statement.
func (rs *Rules) ExplainSQL(st SQLStatement) []Step {
	return rs.explain(func(r *rule) (bool, string) { return r.matchSQL(&st, true) })
}

// explain runs match on each rule in order, up to and including the first
// that matches, and records each verdict.
func (rs *Rules) explain(match func(*rule) (bool, string)) []Step {
	var steps []Step
	for i := range rs.rulesOrNil() {
		r := &rs.rules[i]
		ok, why := match(r)
		steps = append(steps, Step{Rule: r.decision.Rule, Matched: ok, Reason: why})
		if ok {
			break
		}
	}
	return steps
}

func (s Step) String() string {
	verdict := "no match"
	if s.Matched {
		verdict = "MATCH"
	}
	return s.Rule + ": " + verdict + ": " + s.Reason
}
