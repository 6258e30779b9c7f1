package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Usage is the URL form of the etcd scheme.
const Usage = "etcd://[user[:password]@]host[:port][,host[:port]...][/prefix][?tls=true&ca=FILE&cert=FILE&key=FILE&server_name=NAME&skip_verify=false&dial_timeout=5s]"

// PasswordEnv is the environment variable read for the password when the
// URL names a user but no password.
const PasswordEnv = "ETCD_PASSWORD"

const defaultDialTimeout = 5 * time.Second

func init() {
	backend.Register("etcd", backend.Opener{Usage: Usage, Open: Open})
}

// Open connects to the etcd cluster that u names and returns a driver that
// owns the connection. The URL is
//
//	etcd://[user[:password]@]host[:port][,host[:port]...][/prefix]
//
// with endpoints separated by commas (port 2379 by default) and the key
// prefix as the path (default DefaultPrefix). Go's URL parser insists that
// the last endpoint carry a port when there are several, and takes an IPv6
// literal ([::1]:2379) only as the single endpoint; for anything else, build
// a client and use New. Parameters:
//
//	tls=true, ca=FILE, cert=FILE, key=FILE, server_name=NAME, skip_verify=true
//	                    TLS, as every backend reads it (see backend.Params.TLS);
//	                    server_name is checked whatever name gRPC dials
//	dial_timeout=5s     how long Open waits for the cluster to answer
//
// With a user and no password in the URL, the password is read from the
// environment variable ETCD_PASSWORD, so that it need not be in the URL; a
// user with no password found is an error, never a connection without
// password authentication. A client certificate alone (cert and key, no
// user) authenticates as the certificate's common name.
// Open fails within dial_timeout (or ctx) when the cluster cannot be reached.
func Open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	cfg, prefix, err := Config(u)
	if err != nil {
		return nil, err
	}
	backend.WarnTransport(backend.Logger(ctx), u, cfg.TLS)
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: open %s: %w", backend.Redacted(u), permission(err))
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, prefix+"/", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		if err := permission(err); errors.Is(err, backend.ErrPermission) {
			return nil, fmt.Errorf("etcdlock: open %s: reading the prefix %s: %w", backend.Redacted(u), prefix, err)
		}
		return nil, fmt.Errorf("etcdlock: open %s: cluster not reachable: %w", backend.Redacted(u), err)
	}
	return newDriver(cli, true, WithPrefix(prefix)), nil
}

// Config turns an etcd URL (see Open) into a client configuration and a key
// prefix, without connecting.
func Config(u *url.URL) (clientv3.Config, string, error) {
	fail := func(format string, args ...any) (clientv3.Config, string, error) {
		return clientv3.Config{}, "", fmt.Errorf("etcdlock: %s: %w: %s", backend.Redacted(u), backend.ErrInvalidURL, fmt.Sprintf(format, args...))
	}
	if u.Scheme != "etcd" {
		return fail("scheme must be etcd")
	}
	if u.Opaque != "" {
		return fail("want etcd://host:port/prefix")
	}
	var endpoints []string
	for _, h := range strings.Split(u.Host, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), "2379"
		}
		if host == "" || port == "" {
			return fail("bad endpoint %q", h)
		}
		endpoints = append(endpoints, net.JoinHostPort(host, port))
	}
	if len(endpoints) == 0 {
		return fail("no endpoint")
	}
	p := backend.NewParams(u)
	tc, err := p.TLS(false)
	dial := p.Duration("dial_timeout", defaultDialTimeout)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		return clientv3.Config{}, "", fmt.Errorf("etcdlock: %s: %w", backend.Redacted(u), err)
	}
	if dial <= 0 {
		dial = defaultDialTimeout
	}
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: dial,
		Logger:      zap.NewNop(),
		TLS:         tc,
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		pw, ok := u.User.Password()
		if !ok {
			pw = os.Getenv(PasswordEnv)
		}
		if pw == "" {
			// Fail closed: etcd would run us as the client certificate's
			// identity, or with no authentication at all.
			return fail("no password for user %q (in the URL or %s); to authenticate by client certificate alone, name no user", cfg.Username, PasswordEnv)
		}
		cfg.Password = pw
	}
	return cfg, cleanPrefix(u.Path), nil
}
