package envsubst

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// secret has every character that broke or leaked through the old
// expansion, which replaced ${VAR} in the text before YAML parsed it.
const secret = "s3cr#t: {x} y\n#z: ${HOME} 'q\" - [w]"

func parse(t *testing.T, text string) (*yaml.Node, Expansions) {
	t.Helper()
	doc, exps, err := Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return doc, exps
}

func TestValuesArriveIntact(t *testing.T) {
	t.Setenv("ENVSUBST_SECRET", secret)
	t.Setenv("ENVSUBST_PORT", "7700")
	t.Setenv("ENVSUBST_ON", "true")
	t.Setenv("ENVSUBST_WAIT", "30s")
	doc, exps := parse(t, `
plain: ${ENVSUBST_SECRET}
quoted: "${ENVSUBST_SECRET}"
single: 'pre-${ENVSUBST_SECRET}-post'
listen: 127.0.0.1:${ENVSUBST_PORT}
on: ${ENVSUBST_ON}
on_quoted: "${ENVSUBST_ON}"
wait: ${ENVSUBST_WAIT}
unset: ${ENVSUBST_UNSET_42}
unset_quoted: "${ENVSUBST_UNSET_42}"
dollar: $ENVSUBST_SECRET and ${not valid}
${ENVSUBST_PORT}: key
list: [a, "${ENVSUBST_PORT}", {k: ${ENVSUBST_PORT}}]
anchor: &a ${ENVSUBST_SECRET}
alias: *a
flow: {name: ${ENVSUBST_SECRET}, port: ${ENVSUBST_PORT}} # ${ENVSUBST_SECRET}
`)
	var got struct {
		Plain       string            `yaml:"plain"`
		Quoted      string            `yaml:"quoted"`
		Single      string            `yaml:"single"`
		Listen      string            `yaml:"listen"`
		On          bool              `yaml:"on"`
		OnQuoted    string            `yaml:"on_quoted"`
		Wait        time.Duration     `yaml:"wait"`
		Unset       *string           `yaml:"unset"`
		UnsetQuoted *string           `yaml:"unset_quoted"`
		Dollar      string            `yaml:"dollar"`
		Key         string            `yaml:"${ENVSUBST_PORT}"`
		List        []any             `yaml:"list"`
		Anchor      string            `yaml:"anchor"`
		Alias       string            `yaml:"alias"`
		Flow        map[string]any    `yaml:"flow"`
		Rest        map[string]string `yaml:",inline"`
	}
	if err := doc.Decode(&got); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ got, want string }{
		"plain":  {got.Plain, secret},
		"quoted": {got.Quoted, secret},
		"single": {got.Single, "pre-" + secret + "-post"},
		"listen": {got.Listen, "127.0.0.1:7700"},
		"on_q":   {got.OnQuoted, "true"},
		"dollar": {got.Dollar, "$ENVSUBST_SECRET and ${not valid}"},
		"key":    {got.Key, "key"},
		"anchor": {got.Anchor, secret},
		// The alias is the anchor's node: expanded once, so the "${HOME}"
		// inside the secret stays as it is.
		"alias": {got.Alias, secret},
	} {
		if c.got != c.want {
			t.Errorf("%s: %q, want %q", name, c.got, c.want)
		}
	}
	if !got.On || got.Wait != 30*time.Second {
		t.Errorf("a plain value is typed by what it expands to: on %v, wait %v", got.On, got.Wait)
	}
	if got.Unset != nil || got.UnsetQuoted == nil || *got.UnsetQuoted != "" {
		t.Errorf("unset: %v (want absent), quoted %v (want \"\")", got.Unset, got.UnsetQuoted)
	}
	if got.Flow["name"] != secret || got.Flow["port"] != 7700 {
		t.Errorf("in a flow mapping: %#v", got.Flow)
	}
	if c := doc.Content[0].Content[len(doc.Content[0].Content)-1].LineComment; c != "# ${ENVSUBST_SECRET}" {
		t.Errorf("a comment is left as written: %q", c)
	}
	if len(got.List) != 3 || got.List[1] != "7700" || got.List[2].(map[string]any)["k"] != 7700 {
		t.Errorf("list: %#v", got.List)
	}
	var keys []string
	for _, e := range exps {
		keys = append(keys, e.Key)
	}
	want := "plain quoted single listen on on_quoted wait unset unset_quoted list[1] list[2].k anchor flow.name flow.port"
	if strings.Join(keys, " ") != want {
		t.Errorf("expanded keys: %q, want %q", strings.Join(keys, " "), want)
	}
	if e, ok := exps.Of(doc.Content[0].Content[1]); !ok || e.Key != "plain" || e.Vars()[0] != "${ENVSUBST_SECRET}" {
		t.Errorf("Of(plain): %+v %v", e, ok)
	}
}

// TestSyntaxErrors: a file YAML cannot parse is an error that shows
// neither a value nor the tokens that stood in for references.
func TestSyntaxErrors(t *testing.T) {
	t.Setenv("ENVSUBST_SECRET", secret)
	for _, text := range []string{"a: [${ENVSUBST_SECRET}\n", "a: ${ENVSUBST_SECRET}: b\n", "a: \"${ENVSUBST_SECRET}\n"} {
		_, _, err := Parse([]byte(text))
		if err == nil || strings.Contains(err.Error(), "envsubst") || strings.Contains(err.Error(), "s3cr") {
			t.Errorf("%q: %v", text, err)
		}
	}
}

// TestErrorsNameTheVariable decodes an expanded secret into types it does
// not fit, as a config with a variable in the wrong place would, and checks
// that no part of the secret survives Redact in yaml's errors or in an
// error quoting the value.
func TestErrorsNameTheVariable(t *testing.T) {
	t.Setenv("ENVSUBST_SECRET", secret)
	t.Setenv("ENVSUBST_SHORT", "7")
	doc, exps := parse(t, "wait: ${ENVSUBST_SECRET}\nn: \"${ENVSUBST_SECRET}\"\nport: ${ENVSUBST_SHORT}x\n")
	var v struct {
		Wait time.Duration `yaml:"wait"`
		N    int           `yaml:"n"`
		Port int           `yaml:"port"`
	}
	err := doc.Decode(&v)
	var te *yaml.TypeError
	if !errors.As(err, &te) || len(te.Errors) != 3 {
		t.Fatalf("want three type errors, got %v", err)
	}
	for _, msg := range append(te.Errors, "wait: "+strings.ReplaceAll(strings.Trim(strings.TrimSpace(err.Error()), "\n"), "\n", " ")) {
		red := exps.Redact("", msg)
		if strings.Contains(red, secret[:7]) || strings.Contains(red, "s3cr") {
			t.Errorf("Redact(%q) = %q: still shows the secret", msg, red)
		}
	}
	if red := exps.Redact("", te.Errors[0]); !strings.Contains(red, "${ENVSUBST_SECRET}") {
		t.Errorf("Redact(%q) = %q: want it to name the variable", te.Errors[0], red)
	}
	quoted := exps.Redact("wait", fmt.Sprintf("%q is not a duration", secret))
	if quoted != `"${ENVSUBST_SECRET}" is not a duration` {
		t.Errorf("a %%q-quoted value: %q", quoted)
	}
	// A short value is hidden only in a message about its own key.
	if got := exps.Redact("port", `line 3: "7x" is not a port`); got != `line 3: "${ENVSUBST_SHORT}x" is not a port` {
		t.Errorf("own key: %q", got)
	}
	if got := exps.Redact("other", "line 7: 7x"); got != "line 7: 7x" {
		t.Errorf("another key: %q", got)
	}
}
