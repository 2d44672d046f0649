// Command governor is Governor's command-line tool.
//
//	governor explain -config proxy.yaml GET https://api.example.com/v1/x
//	governor explain -config proxy.yaml --sql "INSERT INTO payments ..."
//
// explain says which of governor-proxy's rules a request matches, why each
// earlier rule did not, and what the proxy would charge and hold for it.
// The other subcommands DESIGN.md names (hook, top, caps, doctor) are not
// written yet.
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
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: governor COMMAND [flags] [args]

commands:
  explain   which proxy rule a request or SQL statement matches, and why
  hook, top, caps, doctor   (not written yet)

run "governor explain -h" for its flags.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "explain":
		return explain(args[1:], stdout, stderr)
	case "hook", "top", "caps", "doctor":
		fmt.Fprintf(stderr, "governor %s: not written yet; only explain is available in this build\n", args[0])
		return 2
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "governor: unknown command %q\n\n%s", args[0], usage)
	return 2
}
