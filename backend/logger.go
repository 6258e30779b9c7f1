package backend

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/url"
	"strings"
)

type loggerKey struct{}

// WithLogger returns ctx carrying l for an Opener: locker.Open hands its
// Client's logger (locker.WithLogger) to the driver it opens this way, so
// that the driver's warnings reach the same place.
func WithLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, l)
}

// Logger returns the logger WithLogger put in ctx, or one that discards.
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok && l != nil {
		return l
	}
	return slog.New(slog.DiscardHandler)
}

// WarnTransport logs, at Warn, what makes the transport of u weak: a
// password sent in clear (tc nil) to a host that is not a loopback
// address, and a TLS configuration that accepts any server certificate
// (skip_verify=true). Drivers call it from Open; pgx's sslmode, which only
// sqllock reads, is checked there.
func WarnTransport(log *slog.Logger, u *url.URL, tc *tls.Config) {
	if SkipVerify(tc) {
		log.Warn("locker: skip_verify=true: the server's certificate is not checked, so anyone on the path can pose as the server", "url", Redacted(u))
	}
	if tc == nil && HasPassword(u) && !Loopback(u) {
		log.Warn("locker: a password goes in clear to a remote host: use TLS", "url", Redacted(u))
	}
}

// HasPassword reports whether u carries a password: in its user info or
// in a query parameter named like one.
func HasPassword(u *url.URL) bool {
	if _, ok := u.User.Password(); ok {
		return true
	}
	for name := range u.Query() {
		if SecretParam(name) {
			return true
		}
	}
	return false
}

// Loopback reports whether every host of u (a comma-separated list, or a
// Unix socket path) is this machine: a loopback address or "localhost".
func Loopback(u *url.URL) bool {
	if u.Host == "" {
		return true // a path: a Unix socket or a file
	}
	for _, hp := range strings.Split(u.Host, ",") {
		host := hp
		if h, _, err := net.SplitHostPort(hp); err == nil {
			host = h
		}
		host = strings.Trim(host, "[]")
		if host == "localhost" {
			continue
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// Remote returns the servers, each host:port or a URL, that are not this
// machine (see Loopback; a host's case does not matter).
func Remote(servers []string) []string {
	var remote []string
	for _, s := range servers {
		host := s
		if u, err := url.Parse(s); err == nil && u.Host != "" {
			host = u.Host
		}
		if !Loopback(&url.URL{Host: strings.ToLower(host)}) {
			remote = append(remote, s)
		}
	}
	return remote
}
