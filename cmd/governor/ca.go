package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/governor-project/governor/proxy/intercept"
)

const caUsage = `usage: governor ca create -out DIR [-hosts h1,h2,...] [-validity 90d] [-name CN] [-bundle-roots FILE] [-force]

Makes the certificate authority governor-proxy signs the leaf certificates of
intercepted hosts with (http.intercept): an ECDSA P-256 key and a
self-signed certificate, written as DIR/ca.pem (mode 0644: give it to the
clients to trust) and DIR/ca-key.pem (mode 0600: only governor-proxy reads
it). With -hosts the certificate carries X.509 name constraints, so that
clients which honour them refuse anything its key signs for another host
(docs/proxy.md says which do). Existing files are left alone unless -force.

flags:
`

// The files `governor ca create` writes in -out.
const (
	caCertFile   = "ca.pem"
	caKeyFile    = "ca-key.pem"
	caBundleFile = "bundle.pem"
)

// maxCAValidity bounds -validity: a CA is meant to live about as long as
// the pod it serves, and its key must be guarded for as long as it lives.
const maxCAValidity = 3650 * 24 * time.Hour

func caCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "create" {
		return caCreate(args[1:], stdout, stderr)
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprint(stdout, caUsage)
		return 0
	}
	fmt.Fprint(stderr, caUsage)
	return 2
}

// caCreateOptions are `governor ca create`'s flags, checked.
type caCreateOptions struct {
	dir         string
	ca          intercept.CAOptions
	bundleRoots []byte // the PEM certificates of -bundle-roots; nil: no bundle
	rootsFile   string
	force       bool
}

func caCreate(args []string, stdout, stderr io.Writer) int {
	o, err := parseCACreate(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(stderr, "governor ca create:", err)
		}
		return 2
	}
	if err := writeCA(o, stdout); err != nil {
		fmt.Fprintln(stderr, "governor ca create:", err)
		return 1
	}
	return 0
}

func parseCACreate(args []string, stderr io.Writer) (caCreateOptions, error) {
	fs := flag.NewFlagSet("governor ca create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, caUsage); fs.PrintDefaults() }
	var o caCreateOptions
	fs.StringVar(&o.dir, "out", "", "the directory to write "+caCertFile+" and "+caKeyFile+" in (required; made if missing)")
	hosts := fs.String("hosts", "", "the only hosts the CA may sign for, comma-separated, as http.intercept.hosts lists them (api.openai.com, *.stripe.com, 127.0.0.1); default: any host")
	validity := fs.String("validity", "90d", "how long the CA is valid: days (90d) or a duration (2160h)")
	fs.StringVar(&o.ca.Name, "name", "Governor interception CA", "the CA's common name")
	fs.StringVar(&o.rootsFile, "bundle-roots", "", "also write "+caBundleFile+": this file's certificates (the system roots, e.g. /etc/ssl/certs/ca-certificates.crt) and then the CA, for SSL_CERT_FILE and REQUESTS_CA_BUNDLE, which replace the system roots instead of adding to them")
	fs.BoolVar(&o.force, "force", false, "replace files that exist (clients trusting the old CA must be given the new one)")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return o, err
	} else if err != nil {
		return o, errUsage // the flag package has said what is wrong
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.dir == "" {
		return o, errors.New("-out is required: the directory to write the CA in")
	}
	var err error
	if o.ca.Validity, err = parseValidity(*validity); err != nil {
		return o, fmt.Errorf("-validity: %w", err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["hosts"] {
		if o.ca.Hosts, err = intercept.ParseHosts(strings.Split(*hosts, ",")); err != nil {
			return o, fmt.Errorf("-hosts: entry %w", err)
		}
	}
	if strings.TrimSpace(o.ca.Name) == "" {
		return o, errors.New("-name: the CA's common name is empty")
	}
	if o.rootsFile != "" {
		if o.bundleRoots, err = readRoots(o.rootsFile); err != nil {
			return o, fmt.Errorf("-bundle-roots: %w", err)
		}
	}
	return o, nil
}

// parseValidity reads -validity: a whole number of days (90d), or a Go
// duration (2160h, 36h30m).
func parseValidity(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not a number of days (90d) or a duration (2160h)", s)
		}
		if n > int64(maxCAValidity/(24*time.Hour)) {
			return 0, fmt.Errorf("%s is longer than %dd", s, maxCAValidity/(24*time.Hour))
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("%q is not a number of days (90d) or a duration (2160h)", s)
		}
	}
	if d <= 0 {
		return 0, fmt.Errorf("%s is not a positive duration", s)
	}
	if d > maxCAValidity {
		return 0, fmt.Errorf("%s is longer than %dd", s, maxCAValidity/(24*time.Hour))
	}
	return d, nil
}

// readRoots reads the certificates of a PEM bundle, re-encoded one after
// another (comments and other blocks left out).
func readRoots(file string) ([]byte, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []byte
	for rest := text; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return nil, fmt.Errorf("%s: a certificate does not parse: %w", file, err)
		}
		out = append(out, pem.EncodeToMemory(b)...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return out, nil
}

// writeCA makes the CA and writes its files, refusing to replace any
// unless o.force, and says what it wrote.
func writeCA(o caCreateOptions, stdout io.Writer) error {
	files := []string{caKeyFile, caCertFile}
	if o.bundleRoots != nil {
		files = append(files, caBundleFile)
	}
	if !o.force {
		for _, name := range files {
			path := filepath.Join(o.dir, name)
			if _, err := os.Lstat(path); err == nil {
				return fmt.Errorf("%s exists; -force replaces it (and every client must then trust the new CA)", path)
			} else if !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	now := time.Now()
	o.ca.Now = now
	certPEM, keyPEM, err := intercept.NewCA(o.ca)
	if err != nil {
		return fmt.Errorf("making the CA: %w", err)
	}
	ca, err := intercept.ParseCA(certPEM, keyPEM, now)
	if err != nil {
		return fmt.Errorf("the CA made does not load: %w", err)
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	// The key first: a sidecar watching the directory then never sees a
	// new certificate beside an old key for longer than a poll.
	if err := writeFileAtomic(filepath.Join(o.dir, caKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(o.dir, caCertFile), certPEM, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (the CA certificate, mode 0644: the clients trust it)\n", filepath.Join(o.dir, caCertFile))
	fmt.Fprintf(stdout, "wrote %s (its private key, mode 0600: only governor-proxy reads it)\n", filepath.Join(o.dir, caKeyFile))
	if o.bundleRoots != nil {
		bundle := append(o.bundleRoots, certPEM...)
		if err := writeFileAtomic(filepath.Join(o.dir, caBundleFile), bundle, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s (the certificates of %s, then the CA: for SSL_CERT_FILE and REQUESTS_CA_BUNDLE)\n",
			filepath.Join(o.dir, caBundleFile), o.rootsFile)
	}
	fmt.Fprintf(stdout, "the CA %q expires %s (in %s)\n", ca.Cert.Subject.CommonName,
		ca.Cert.NotAfter.UTC().Format(time.RFC3339), inDays(ca.Cert.NotAfter.Sub(now)))
	if o.ca.Hosts != nil {
		fmt.Fprintf(stdout, "it may sign only for %s (X.509 name constraints; a name covers the names below it too)\n",
			strings.Join(o.ca.Hosts.Patterns(), ", "))
	} else {
		fmt.Fprintln(stdout, "it has no name constraints: its key can sign for any host (-hosts limits it)")
	}
	return nil
}

// inDays says how long d is: in days (30d) when it is two or more.
func inDays(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= 2*day {
		return fmt.Sprintf("%dd", d.Round(day)/day)
	}
	return d.Round(time.Minute).String()
}

// writeFileAtomic writes a file whole or not at all, with mode perm
// whatever the umask, replacing any file at path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // once renamed, there is nothing to remove
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
