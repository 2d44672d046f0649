package classify

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/governor-project/governor/internal/configfile"
)

// Meter asks the proxy to meter an LLM call's tokens: reserve an estimate
// before forwarding it, settle to the usage its response reports.
//
//	meter: openai                      # the API; everything else default
//	meter: {api: anthropic, resource: tokens, reserve: 4096, bytes_per_token: 1,
//	        max_body: 4194304, oversize: refuse}
type Meter struct {
	// API is the wire format: "openai" (chat completions, completions,
	// responses) or "anthropic" (messages).
	API string
	// Resource is the quota charged. Default "tokens".
	Resource string
	// Reserve is the output reserved for a request that names no limit
	// (max_tokens, max_completion_tokens, max_output_tokens). Default
	// DefaultMeterReserve.
	Reserve int64
	// BytesPerToken estimates the input from the body's size: one token
	// per this many bytes. Default 1, an upper bound for text, so that a
	// budget is never exceeded; more reserves less.
	BytesPerToken int64
	// MaxBody bounds the request body read to estimate, and the JSON
	// response body kept to read its usage. Default DefaultMeterMaxBody.
	MaxBody int64
	// Unmetered lets a request body over MaxBody through unmetered
	// (oversize: unmetered); otherwise it is refused (oversize: refuse).
	Unmetered bool
	// Clamp lowers the output limit of a call whose estimate does not fit
	// in what the budget has left to what does fit, and lets it go ahead
	// (on_over_estimate: clamp); otherwise such a call is refused, saying
	// what would fit (on_over_estimate: refuse).
	Clamp bool
}

// Defaults of a meter's keys.
const (
	DefaultMeterResource = "tokens"
	DefaultMeterReserve  = 4096
	DefaultMeterMaxBody  = 4 << 20

	// The largest values the keys take: an output limit no provider
	// reaches, a body of 1 GiB, and 1 MiB a token.
	MaxMeterReserve       = 1 << 24
	MaxMeterMaxBody       = 1 << 30
	MaxMeterBytesPerToken = 1 << 20
)

type fileMeter struct {
	API           *string  `yaml:"api"`
	Resource      *string  `yaml:"resource"`
	Reserve       *integer `yaml:"reserve"`
	BytesPerToken *integer `yaml:"bytes_per_token"`
	MaxBody       *integer `yaml:"max_body"`
	Oversize      *string  `yaml:"oversize"`
	OverEstimate  *string  `yaml:"on_over_estimate"`
}

// compileMeter reads the meter: key, a scalar (the API) or a mapping.
func compileMeter(n *yaml.Node) (*Meter, error) {
	n = resolve(n)
	var fm fileMeter
	if n.Kind == yaml.ScalarNode {
		api := n.Value
		fm.API = &api
	} else if err := configfile.Decode(n, "meter", &fm); err != nil {
		return nil, err
	}
	m := &Meter{Resource: DefaultMeterResource, Reserve: DefaultMeterReserve, BytesPerToken: 1, MaxBody: DefaultMeterMaxBody}
	if fm.API == nil {
		return nil, fieldErr("meter.api", "is missing (openai or anthropic)")
	}
	switch *fm.API {
	case "openai", "anthropic":
		m.API = *fm.API
	default:
		return nil, fieldErr("meter.api", "%q is not an API the proxy meters (openai, anthropic)", *fm.API)
	}
	if fm.Resource != nil {
		if err := checkName(*fm.Resource); err != nil {
			return nil, fieldErr("meter.resource", "%v", err)
		}
		m.Resource = *fm.Resource
	}
	for _, f := range []struct {
		key string
		v   *integer
		dst *int64
		max int64
	}{{"reserve", fm.Reserve, &m.Reserve, MaxMeterReserve}, {"bytes_per_token", fm.BytesPerToken, &m.BytesPerToken, MaxMeterBytesPerToken},
		{"max_body", fm.MaxBody, &m.MaxBody, MaxMeterMaxBody}} {
		if f.v == nil {
			continue
		}
		if *f.v <= 0 || int64(*f.v) > f.max {
			return nil, fieldErr("meter."+f.key, "%d is not from 1 to %d", *f.v, f.max)
		}
		*f.dst = int64(*f.v)
	}
	if fm.OverEstimate != nil {
		switch *fm.OverEstimate {
		case "refuse":
		case "clamp":
			m.Clamp = true
		default:
			return nil, fieldErr("meter.on_over_estimate", "%q is not refuse or clamp", *fm.OverEstimate)
		}
	}
	if fm.Oversize != nil {
		switch *fm.Oversize {
		case "refuse":
		case "unmetered":
			m.Unmetered = true
		default:
			return nil, fieldErr("meter.oversize", "%q is not refuse or unmetered", *fm.Oversize)
		}
	}
	return m, nil
}

func (m *Meter) String() string {
	s := fmt.Sprintf("meter %s %s (reserve the output limit or %d, plus a token per %d bytes of body)", m.API, m.Resource, m.Reserve, m.BytesPerToken)
	if m.Unmetered {
		s += fmt.Sprintf("; a body over %d bytes passes unmetered", m.MaxBody)
	}
	if m.Clamp {
		s += "; an output limit the budget cannot cover is lowered to what it can"
	}
	return s
}
