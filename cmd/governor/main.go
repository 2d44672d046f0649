// Command governor is Governor's command-line tool.
//
//	governor explain -config proxy.yaml GET https://api.example.com/v1/x
//	governor explain -config proxy.yaml --sql "INSERT INTO payments ..."
//	printf %s "$KEY" | governor hash-key
//	governor caps get|set|history NODE ...
//	governor tenant NAME suspend|resume|read-only|close -reason "why" [-revoke]
//	governor usage [-since 24h] [-format table|csv|json]
//	governor doctor [-config governord.yaml] [-proxy-config proxy.yaml] [-json]
//	governor ca create -out DIR [-hosts api.openai.com,*.stripe.com] [-validity 90d]
//	governor inject -f deployment.yaml | governor inject serve -tls-cert F -tls-key K
//	governor hook -agent claude|codex [-max-calls N] ...
//	governor top   (or governor ui)
//
// explain says which of governor-proxy's rules a request matches, why each
// earlier rule did not, and what the proxy would charge and hold for it.
// hash-key prints the SHA-256 of an API key read from stdin, for
// governord's api_key_sha256. ca create makes the CA of governor-proxy's
// HTTPS interception (ca.go). inject adds governor-proxy to the pods
// annotated for it, as a command or as Kubernetes' admission webhook
// (inject.go, package kubeinject). The others talk to governord, reading the
// environment the SDK reads (GOVERNOR_ADDR, GOVERNOR_API_KEY, GOVERNOR_TLS,
// GOVERNOR_CA_FILE); docs/cli.md describes each. The files: caps.go, tenant.go,
// usage.go, doctor*.go, hook.go, top.go (its screen is package cli/top),
// connect.go (the session and node paths they share).
//
// Bad flags or arguments exit with status 2; a config file that fails to
// load also exits 2, naming the key.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage: governor COMMAND [flags] [args]

commands:
  explain   which proxy rule a request or SQL statement matches, and why
  hash-key  the SHA-256 of an API key read from stdin, for api_key_sha256
  caps      a node's caps (get), change them with a reason (set), their audit trail (history)
  tenant    suspend, resume, make read-only or close a tenant, with a reason
  usage     what each tenant and task spent, held and was refused over a window
  doctor    what is wrong: connectivity, TLS, clock, config lint, the tree, pgwire upstreams, the interception CA
  ca        create: the CA governor-proxy signs intercepted hosts' certificates with
  inject    add governor-proxy to annotated pods: -f prints injected manifests; serve is the admission webhook
  hook      a PreToolUse hook for Claude Code and Codex: budgets of tool calls, subagents and time
  top       a live view of the tree (alias: ui); edits caps with a reason

run "governor explain -h" for its flags.
`

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "explain":
		return explain(args[1:], stdout, stderr)
	case "hash-key":
		return hashKey(args[1:], stdin, stdout, stderr)
	case "caps":
		return caps(args[1:], stdout, stderr)
	case "tenant":
		return tenantCmd(args[1:], stdout, stderr)
	case "usage":
		return usageCmd(args[1:], stdout, stderr)
	case "doctor":
		return doctor(args[1:], stdout, stderr)
	case "ca":
		return caCmd(args[1:], stdout, stderr)
	case "inject":
		return injectCmd(args[1:], stdin, stdout, stderr) // inject.go
	case "hook":
		return hook(args[1:], stdin, stdout, stderr)
	case "top", "ui":
		return topCmd(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "governor: unknown command %q\n\n%s", args[0], usage)
	return 2
}
