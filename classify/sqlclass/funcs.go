package sqlclass

import "strings"

// A function call gives a statement the kind function, unless the function
// is a built-in known only to read (readOnlyFunctions): a user's function,
// nextval, set_config or pg_advisory_lock may write or take locks where the
// classifier cannot see. A call is a name followed by "(" where SQL's own
// syntax has no parenthesis of its own (IN (...), OVER (...), a column list,
// a type's modifier, ...). Calls are looked for in queries and DML, not in
// DDL (where names followed by "(" are mostly signatures and column
// definitions).

// maybeCall looks at a "(" that neither a frame nor a reader claimed.
func (c *classifier) maybeCall() {
	st := &c.st
	f := c.top()
	if f.calls || !f.detectsCalls() {
		return
	}
	p, fn := st.prev, st.fn
	if fn.parts == 0 || !p.isIdent() {
		return
	}
	if fn.parts == 1 && p.kind == tokIdent && (p.kw.notCall() || p.kw.reserved()) {
		return
	}
	if c.readOnlyCall(fn) {
		return
	}
	f.calls = true
}

// readOnlyCall reports a call of a built-in in readOnlyFunctions, unqualified
// or qualified with pg_catalog, its name read as the server reads it.
func (c *classifier) readOnlyCall(fn funcName) bool {
	var buf [maxFunctionName + 16]byte
	switch fn.parts {
	case 1:
	case 2:
		if string(c.appendName(buf[:0], fn.qual, len("pg_catalog")+1)) != "pg_catalog" {
			return false
		}
	default:
		return false
	}
	name := c.appendName(buf[:0], fn.last, maxFunctionName+1)
	if len(name) > maxFunctionName {
		return false
	}
	_, ok := readOnlyFunctions[string(name)]
	return ok
}

// isFromFunction: SQL functions whose arguments use FROM. Only ASCII
// letters fold, as in the server's keywords.
func isFromFunction(w string) bool {
	switch len(w) {
	case 4, 7, 8, 9:
	default:
		return false
	}
	for _, f := range [...]string{"extract", "substring", "trim", "overlay", "position"} {
		if equalFoldASCII(w, f) {
			return true
		}
	}
	return false
}

// equalFoldASCII reports whether s is lower, a lower-case ASCII word, with
// its ASCII letters folded.
func equalFoldASCII(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// maxFunctionName is longer than any name in readOnlyFunctions.
const maxFunctionName = 40

// readOnlyFunctions are built-ins that read and compute, and write nothing,
// take no lock and change no setting: aggregates, window functions,
// arithmetic, text, date and JSON functions and the like. A function of the
// same name in another schema earlier in search_path is taken for the
// built-in.
var readOnlyFunctions = func() map[string]struct{} {
	m := map[string]struct{}{}
	for _, f := range strings.Fields(`
		count sum avg min max array_agg string_agg json_agg jsonb_agg json_object_agg jsonb_object_agg
		bool_and bool_or every bit_and bit_or bit_xor stddev stddev_pop stddev_samp variance var_pop var_samp
		percentile_cont percentile_disc mode corr covar_pop covar_samp regr_slope regr_intercept any_value
		row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
		coalesce nullif greatest least grouping
		now current_timestamp current_time localtime localtimestamp clock_timestamp statement_timestamp
		transaction_timestamp timeofday date_trunc date_part date_bin extract age make_date make_time
		make_timestamp make_timestamptz make_interval to_timestamp to_date to_char to_number isfinite
		justify_days justify_hours justify_interval
		lower upper initcap length char_length character_length octet_length bit_length substring substr
		trim btrim ltrim rtrim position strpos overlay concat concat_ws replace split_part left right
		repeat reverse lpad rpad starts_with format quote_ident quote_literal quote_nullable
		regexp_replace regexp_match regexp_matches regexp_split_to_array regexp_split_to_table regexp_like
		regexp_count regexp_instr regexp_substr translate ascii chr md5 sha224 sha256 sha384 sha512
		encode decode convert_from convert_to string_to_array array_to_string to_hex normalize
		abs ceil ceiling floor round trunc mod power pow sqrt cbrt exp ln log log10 sign pi degrees
		radians sin cos tan asin acos atan atan2 random div gcd lcm width_bucket scale
		array_length array_upper array_lower array_dims array_position array_positions array_append
		array_prepend array_cat array_remove array_replace cardinality unnest generate_series
		generate_subscripts
		to_json to_jsonb row_to_json array_to_json json_build_object jsonb_build_object json_build_array
		jsonb_build_array json_object jsonb_object json_extract_path json_extract_path_text
		jsonb_extract_path jsonb_extract_path_text json_array_elements jsonb_array_elements
		json_array_elements_text jsonb_array_elements_text json_each jsonb_each json_each_text
		jsonb_each_text json_object_keys jsonb_object_keys jsonb_set jsonb_insert jsonb_strip_nulls
		jsonb_pretty json_typeof jsonb_typeof jsonb_path_query jsonb_path_query_array
		jsonb_path_query_first jsonb_path_exists jsonb_path_match json_array_length jsonb_array_length
		json_populate_record jsonb_populate_record json_to_record jsonb_to_record json_to_recordset
		jsonb_to_recordset json_array json_exists json_value json_query
		to_tsvector to_tsquery plainto_tsquery websearch_to_tsquery phraseto_tsquery ts_rank ts_rank_cd
		ts_headline
		int4range int8range numrange tsrange tstzrange daterange isempty lower_inc upper_inc
		text int int2 int4 int8 integer bigint smallint float4 float8 real bool boolean date uuid json jsonb
		xmlelement xmlforest xmlagg xmlparse xmlserialize xmlconcat xpath
		current_setting version current_database current_schema current_schemas current_user session_user
		pg_backend_pid gen_random_uuid currval lastval pg_typeof pg_column_size pg_size_pretty
		pg_relation_size pg_total_relation_size pg_database_size to_regclass obj_description
		col_description has_table_privilege has_schema_privilege has_column_privilege
		pg_sleep pg_sleep_for bernoulli system merge_action`) {
		if len(f) > maxFunctionName {
			panic("sqlclass: a read-only function's name is longer than maxFunctionName")
		}
		m[f] = struct{}{}
	}
	return m
}()
