package sqlclass

// keyword identifies an unquoted word this package looks at; kwNone is any
// other word. Words the code names have constants; the rest of the words in
// the lists below get numbers of their own at init, so that their flags can
// be looked up by number.
type keyword uint16

const (
	kwNone keyword = iota
	kwAbort
	kwAll
	kwAlter
	kwAnalyse
	kwAnalyze
	kwAs
	kwAtomic
	kwBegin
	kwCall
	kwCase
	kwCharacteristics
	kwComment
	kwCommit
	kwConflict
	kwCopy
	kwCreate
	kwDeallocate
	kwDeclare
	kwDelete
	kwDiscard
	kwDistinct
	kwDo
	kwDrop
	kwEnd
	kwExecute
	kwExists
	kwExplain
	kwFalse
	kwFor
	kwFrom
	kwGrant
	kwIf
	kwImport
	kwIndex
	kwInsert
	kwInto
	kwJoin
	kwKey
	kwLateral
	kwLock
	kwMaterialized
	kwMerge
	kwNo
	kwNot
	kwOff
	kwOn
	kwOnly
	kwPolicy
	kwPrepare
	kwReassign
	kwRecursive
	kwRefresh
	kwRelease
	kwRevoke
	kwRollback
	kwRule
	kwSavepoint
	kwSecurity
	kwSelect
	kwSession
	kwSet
	kwShare
	kwStart
	kwStatistics
	kwTable
	kwTemp
	kwTemporary
	kwTransaction
	kwTrigger
	kwTruncate
	kwUescape
	kwUnlogged
	kwUpdate
	kwUsing
	kwValues
	kwVerbose
	kwWith
	kwNamed // the words above have constants; later numbers are given at init
)

var namedKeywords = [kwNamed]string{
	kwAbort: "abort", kwAll: "all", kwAlter: "alter", kwAnalyse: "analyse", kwAnalyze: "analyze",
	kwAs: "as", kwAtomic: "atomic", kwBegin: "begin", kwCall: "call", kwCase: "case",
	kwCharacteristics: "characteristics", kwComment: "comment", kwCommit: "commit",
	kwConflict: "conflict", kwCopy: "copy", kwCreate: "create", kwDeallocate: "deallocate",
	kwDeclare: "declare", kwDelete: "delete", kwDiscard: "discard", kwDistinct: "distinct",
	kwDo: "do", kwDrop: "drop", kwEnd: "end", kwExecute: "execute", kwExists: "exists",
	kwExplain: "explain", kwFalse: "false", kwFor: "for", kwFrom: "from", kwGrant: "grant",
	kwIf: "if", kwImport: "import", kwIndex: "index", kwInsert: "insert", kwInto: "into",
	kwJoin: "join", kwKey: "key", kwLateral: "lateral", kwLock: "lock",
	kwMaterialized: "materialized", kwMerge: "merge", kwNo: "no", kwNot: "not", kwOff: "off",
	kwOn: "on", kwOnly: "only", kwPolicy: "policy", kwPrepare: "prepare", kwReassign: "reassign",
	kwRecursive: "recursive", kwRefresh: "refresh", kwRelease: "release", kwRevoke: "revoke",
	kwRollback: "rollback", kwRule: "rule", kwSavepoint: "savepoint", kwSecurity: "security",
	kwSelect: "select", kwSession: "session", kwSet: "set", kwShare: "share", kwStart: "start",
	kwStatistics: "statistics", kwTable: "table", kwTemp: "temp", kwTemporary: "temporary",
	kwTransaction: "transaction", kwTrigger: "trigger", kwTruncate: "truncate",
	kwUescape: "uescape", kwUnlogged: "unlogged", kwUpdate: "update", kwUsing: "using",
	kwValues: "values", kwVerbose: "verbose", kwWith: "with",
}

// reservedWords end a table reference, or cannot be a table name where this
// package looks for one.
var reservedWords = []string{
	"where", "join", "inner", "left", "right", "full", "outer", "cross", "natural", "on", "using",
	"group", "order", "limit", "offset", "having", "window", "union", "intersect", "except", "for",
	"returning", "set", "fetch", "into", "values", "tablesample", "lateral", "when", "then", "else",
	"select", "from", "as", "and", "or", "not", "default", "do", "with", "to", "only", "nowait",
	"skip", "in", "is", "null", "true", "false", "case", "end", "all", "distinct", "by", "overriding",
	"stdin", "stdout", "cascade", "restrict", "if", "exists", "partition", "of", "table", "matched",
	"insert", "update", "delete", "merge", "nothing", "conflict", "array", "row",
}

// objectWords may follow GRANT ... ON, or ON in CREATE INDEX and the like,
// where they name something other than a table.
var objectWords = []string{
	"all", "schema", "database", "function", "procedure", "routine", "sequence", "foreign",
	"language", "large", "type", "domain", "tablespace", "parameter", "conflict",
}

// notCallWords are words a "(" may follow without making a function call:
// SQL's own constructs (IN (...), OVER (...), CAST(...), ...), option lists
// of utility statements, and type names with a modifier (varchar(20)).
var notCallWords = []string{
	// expressions and clauses
	"all", "and", "any", "array", "as", "between", "by", "case", "cast", "cube", "distinct",
	"do", "else", "escape", "except", "exists", "filter", "first", "from", "group", "grouping",
	"having", "ilike", "in", "intersect", "is", "join", "lateral", "like", "limit", "next",
	"not", "offset", "on", "only", "or", "order", "over", "overlaps", "partition", "range",
	"recursive", "returning", "rollup", "row", "rows", "groups", "select", "sets", "similar",
	"some", "then", "to", "union", "using", "values", "variadic", "when", "where", "window",
	"with", "within", "materialized", "set", "conflict", "into", "table", "repeatable",
	"tablesample", "default", "check", "unique", "primary", "references", "foreign", "include",
	"options", "returns", "ordinality", "nulls", "format",
	// utility statements with option lists
	"analyse", "analyze", "cluster", "explain", "reindex", "vacuum", "copy", "lock", "call",
	"execute", "prepare", "declare",
	// type names that take a modifier
	"bit", "char", "character", "dec", "decimal", "double", "float", "interval", "national",
	"nchar", "numeric", "precision", "time", "timestamp", "timestamptz", "timetz", "varbit",
	"varchar", "varying", "zone",
}

// keyword flags
const (
	kfReserved uint8 = 1 << iota
	kfObject
	kfNotCall
)

var (
	keywords     = map[string]keyword{}
	keywordFlags []uint8
	maxKeyword   int // the longest word, in bytes
)

func init() {
	add := func(w string) keyword {
		if k, ok := keywords[w]; ok {
			return k
		}
		k := keyword(len(keywordFlags))
		keywords[w] = k
		keywordFlags = append(keywordFlags, 0)
		maxKeyword = max(maxKeyword, len(w))
		return k
	}
	keywordFlags = make([]uint8, kwNamed)
	for k, w := range namedKeywords {
		if k != int(kwNone) {
			keywords[w] = keyword(k)
			maxKeyword = max(maxKeyword, len(w))
		}
	}
	for _, l := range []struct {
		words []string
		flag  uint8
	}{{reservedWords, kfReserved}, {objectWords, kfObject}, {notCallWords, kfNotCall}} {
		for _, w := range l.words {
			keywordFlags[add(w)] |= l.flag
		}
	}
	if maxKeyword > 32 {
		panic("sqlclass: a keyword is longer than lookupKeyword's buffer")
	}
}

func (k keyword) reserved() bool { return keywordFlags[k]&kfReserved != 0 }
func (k keyword) object() bool   { return keywordFlags[k]&kfObject != 0 }
func (k keyword) notCall() bool  { return keywordFlags[k]&kfNotCall != 0 }

// lookupKeyword returns the keyword an unquoted word is (ASCII letters fold
// to lower case, as PostgreSQL folds them), or kwNone. It does not allocate.
func lookupKeyword(w string) keyword {
	if len(w) > maxKeyword {
		return kwNone
	}
	var buf [32]byte
	b := buf[:len(w)]
	for i := 0; i < len(w); i++ {
		c := w[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b[i] = c
	}
	return keywords[string(b)]
}
