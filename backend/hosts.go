package backend

import (
	"fmt"
	"hash/fnv"
	"net"
	"net/url"
	"strings"
)

// Hosts returns the servers listed in u's host, "h1:p1,h2,[::1]:p3", each
// as host:port with defaultPort where none is given. An empty list, an
// empty entry ("h1,,h2", a trailing comma), an empty host or an empty port
// is an error wrapping ErrInvalidURL: a list that says less than it seems
// to is a typo, not a server to skip.
func Hosts(u *url.URL, defaultPort string) ([]string, error) {
	if u.Opaque != "" {
		// "scheme:user:pw@host" (no "//") parses as scheme and opaque.
		return nil, fmt.Errorf("%w: want %s://host:port, with the two slashes", ErrInvalidURL, u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: no server", ErrInvalidURL)
	}
	var out []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return nil, fmt.Errorf("%w: an empty server in the list %q", ErrInvalidURL, u.Host)
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			// No port: a name, an IPv4 address, or a bracketed IPv6 one.
			host, port = h, defaultPort
			if len(h) > 2 && h[0] == '[' && h[len(h)-1] == ']' {
				host = h[1 : len(h)-1]
			} else if strings.ContainsAny(h, "[]:") {
				return nil, fmt.Errorf("%w: server %q is not host[:port]", ErrInvalidURL, h)
			}
		}
		if host == "" || port == "" {
			return nil, fmt.Errorf("%w: server %q is not host[:port]", ErrInvalidURL, h)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}

// OneOf spreads names over n places (servers, slots): s's place, 0 to
// n-1, is FNV-1a of s mod n, the same in every process and version.
func OneOf(s string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(s))
	return int(h.Sum32() % uint32(n))
}
