package zklock

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/lockerhq/locker/backend"
)

func init() {
	backend.Register("zk", backend.OpenerFunc("zk://[user:password@]host1:2181[,host2:2181...][/root][?session_timeout=10s&connect_timeout=5s&tls=true&ca=FILE&cert=FILE&key=FILE&server_name=NAME&skip_verify=false]",
		func(ctx context.Context, u *url.URL) (*Driver, error) { return open(ctx, u, nil) }))
}

// Open opens a driver for a zk:// URL (see the package documentation).
// session_timeout defaults to the default lock TTL in ctx (see
// backend.WithDefaultTTL), else to DefaultSessionTimeout. A port may be
// left out (2181) except on the last host, which url.Parse checks; a list
// of IPv6 literals does not parse as a URL (use Dial). Close closes the
// connection, as Dial's. opts apply after the URL's, so they override it.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Driver, error) {
	u, err := backend.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("zklock: %w", err)
	}
	return open(ctx, u, opts)
}

// open is Open after backend.ParseURL, and the registry's opener.
func open(ctx context.Context, u *url.URL, extra []Option) (*Driver, error) {
	servers, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	// So that a crashed holder keeps others out for about the TTL asked.
	if ttl, ok := backend.DefaultTTL(ctx); ok && !u.Query().Has("session_timeout") {
		opts = append(opts, WithSessionTimeout(ttl))
	}
	log := backend.Logger(ctx)
	opts = append(append([]Option{WithLogger(log)}, opts...), extra...)
	backend.WarnTransport(log, u, defaults(opts).tls)
	return Dial(ctx, servers, opts...)
}

func parseURL(u *url.URL) ([]string, []Option, error) {
	if u.Scheme != "zk" {
		return nil, nil, fmt.Errorf("zklock: %w: scheme %q, want zk", backend.ErrInvalidURL, u.Scheme)
	}
	servers, err := backend.Hosts(u, "2181")
	if err != nil {
		return nil, nil, fmt.Errorf("zklock: %w", err)
	}
	var opts []Option
	root := u.Path
	if root == "" || root == "/" {
		root = DefaultRoot
	}
	if err := checkRoot(root); err != nil {
		return nil, nil, fmt.Errorf("zklock: %w: %v", backend.ErrInvalidURL, err)
	}
	opts = append(opts, WithRoot(root))
	if u.User != nil {
		pass, ok := u.User.Password()
		if !ok || u.User.Username() == "" {
			return nil, nil, fmt.Errorf("zklock: %w: digest auth needs user:password", backend.ErrInvalidURL)
		}
		opts = append(opts, WithDigestAuth(u.User.Username(), pass))
	}
	p := backend.NewParams(u)
	st := p.Duration("session_timeout", DefaultSessionTimeout)
	ct := p.Duration("connect_timeout", DefaultConnectTimeout)
	tc, err := p.TLS(false)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("zklock: %w", err)
	}
	if tc != nil {
		opts = append(opts, WithTLS(tc))
	}
	if st <= 0 || ct <= 0 {
		return nil, nil, fmt.Errorf("zklock: %w: session_timeout and connect_timeout must be positive", backend.ErrInvalidURL)
	}
	opts = append(opts, WithSessionTimeout(st), WithConnectTimeout(ct))
	return servers, opts, nil
}

// checkRoot accepts an absolute ZooKeeper path with no trailing slash,
// empty, "." or ".." segment, or character ZooKeeper refuses.
func checkRoot(root string) error {
	if !strings.HasPrefix(root, "/") || root == "/" || strings.HasSuffix(root, "/") {
		return fmt.Errorf("root %q: want an absolute path such as /locker", root)
	}
	for _, seg := range strings.Split(root[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("root %q: empty, . or .. segment", root)
		}
		for _, r := range seg {
			if r < 0x20 || r >= 0x7f && r <= 0x9f || r >= 0xd800 && r <= 0xf8ff || r >= 0xfff0 {
				return fmt.Errorf("root %q: character %U not allowed in ZooKeeper paths", root, r)
			}
		}
	}
	if root == "/zookeeper" || strings.HasPrefix(root, "/zookeeper/") {
		return fmt.Errorf("root %q: /zookeeper is reserved", root)
	}
	return nil
}
