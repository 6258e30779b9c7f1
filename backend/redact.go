package backend

import (
	"net/url"
	"strings"
)

// Redacted returns u as text for messages and logs, with every secret
// replaced by "xxxxx": the password of the user info and the value of
// every query parameter whose name says it carries one (see SecretParam).
// The core, every driver and lockctl print URLs through it, and nothing
// else. A nil u is "".
func Redacted(u *url.URL) string {
	if u == nil {
		return ""
	}
	c := *u
	if i := strings.LastIndexByte(c.Opaque, '@'); i >= 0 {
		// "redis:pw@host" (no "//") parses with the user info in Opaque.
		c.Opaque = "xxxxx" + c.Opaque[i:]
	}
	if c.RawQuery != "" {
		q, err := url.ParseQuery(c.RawQuery)
		if err != nil {
			// Unparsable: no way to tell values from names.
			c.RawQuery = "xxxxx"
		} else {
			changed := false
			for name, vs := range q {
				if SecretParam(name) {
					for i := range vs {
						vs[i] = "xxxxx"
					}
					changed = true
				}
			}
			if changed {
				c.RawQuery = q.Encode()
			}
		}
	}
	return c.Redacted()
}

// RedactedString is Redacted for a URL or DSN given as text. Text that does
// not parse as a URL is not printed at all, since there is no telling where
// a password in it would be.
func RedactedString(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return Redacted(u)
}

// SecretParam reports whether a query parameter of that name carries a
// secret: its name contains "pass", "pwd", "secret", "token" or
// "credential", or ends in "apikey" or "api_key" (any case). pgx's
// password and sslpassword are such names; a file name parameter such as
// key= or sslkey= is not.
func SecretParam(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "token", "credential"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return strings.HasSuffix(n, "apikey") || strings.HasSuffix(n, "api_key")
}

// Scrub returns text with every secret of u (those Redacted hides) replaced
// by "xxxxx", as written and percent-encoded: for the messages of client
// libraries, which may quote a URL or its parts.
func Scrub(text string, u *url.URL) string {
	if u == nil {
		return text
	}
	var secrets []string
	if pw, ok := u.User.Password(); ok {
		secrets = append(secrets, pw)
	}
	if q, err := url.ParseQuery(u.RawQuery); err == nil {
		for name, vs := range q {
			if SecretParam(name) {
				secrets = append(secrets, vs...)
			}
		}
	}
	for _, s := range secrets {
		if s == "" {
			continue
		}
		for _, form := range []string{s, url.PathEscape(s), url.QueryEscape(s)} {
			text = strings.ReplaceAll(text, form, "xxxxx")
		}
	}
	return text
}
