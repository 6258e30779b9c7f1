package backend

import (
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Params reads a URL's query parameters and reports those nobody read, so
// that a misspelt option is an error rather than silently ignored.
type Params struct {
	values url.Values
	used   map[string]bool
	err    error
}

// NewParams returns the query parameters of u. A parameter given more
// than once is an error (Err), whichever copy a reader would take.
func NewParams(u *url.URL) *Params {
	p := &Params{values: u.Query(), used: map[string]bool{}}
	var twice []string
	for name, vs := range p.values {
		if len(vs) > 1 {
			twice = append(twice, name)
		}
	}
	if len(twice) > 0 {
		sort.Strings(twice)
		p.err = fmt.Errorf("%w: parameter(s) %s given more than once", ErrInvalidURL, strings.Join(twice, ", "))
	}
	return p
}

// Has reports whether the parameter is present, and marks it read.
func (p *Params) Has(name string) bool {
	p.used[name] = true
	_, ok := p.values[name]
	return ok
}

// String returns the parameter's value, or def when it is absent.
func (p *Params) String(name, def string) string {
	if !p.Has(name) {
		return def
	}
	return p.values.Get(name)
}

// Duration parses a Go duration ("1500ms"), or returns def when absent.
func (p *Params) Duration(name string, def time.Duration) time.Duration {
	if !p.Has(name) {
		return def
	}
	d, err := time.ParseDuration(p.values.Get(name))
	if err != nil || d < 0 {
		p.fail(name, "a non-negative duration such as 1500ms")
		return def
	}
	return d
}

// Int parses a decimal integer, or returns def when absent.
func (p *Params) Int(name string, def int) int {
	if !p.Has(name) {
		return def
	}
	n, err := strconv.Atoi(p.values.Get(name))
	if err != nil {
		p.fail(name, "an integer")
		return def
	}
	return n
}

// Bool parses true/false/1/0, or returns def when absent.
func (p *Params) Bool(name string, def bool) bool {
	if !p.Has(name) {
		return def
	}
	b, err := strconv.ParseBool(p.values.Get(name))
	if err != nil {
		p.fail(name, "true or false")
		return def
	}
	return b
}

func (p *Params) fail(name, want string) {
	if p.err == nil {
		v := fmt.Sprintf("%q", p.values.Get(name))
		if SecretParam(name) {
			v = "xxxxx"
		}
		p.err = fmt.Errorf("%w: parameter %s=%s: want %s", ErrInvalidURL, name, v, want)
	}
}

// Err returns the first parse error, or an error naming every parameter
// that was not read, or nil.
func (p *Params) Err() error {
	if p.err != nil {
		return p.err
	}
	var unknown []string
	for name := range p.values {
		if !p.used[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return fmt.Errorf("%w: unknown parameter(s) %s", ErrInvalidURL, strings.Join(unknown, ", "))
}
