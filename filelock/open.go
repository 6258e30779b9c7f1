package filelock

import (
	"context"
	"fmt"
	"net/url"

	"github.com/lockerhq/locker/backend"
)

// Usage is the URL form this package registers.
const Usage = "file:///absolute/dir  or  file:relative/dir  [?sync=false]"

func init() {
	backend.Register("file", backend.OpenerFunc(Usage, func(ctx context.Context, u *url.URL) (*Driver, error) {
		return openURL(ctx, u, nil)
	}))
}

// Open returns a driver for a file: URL (see the package documentation).
// Options given here override the URL's.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Driver, error) {
	u, err := backend.ParseURL(rawURL, "file")
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	return openURL(ctx, u, opts)
}

// openURL is Open for a parsed URL; the registry's opener calls it too.
func openURL(ctx context.Context, u *url.URL, opts []Option) (*Driver, error) {
	p := backend.NewParams(u)
	sync := p.Bool("sync", true)
	if err := p.Err(); err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	bad := func(why string) error {
		return fmt.Errorf("filelock: %w: %s (want file:///absolute/dir or file:relative/dir)", backend.ErrInvalidURL, why)
	}
	if u.User != nil {
		return nil, bad("no user or password")
	}
	if u.Host != "" && u.Host != "localhost" {
		return nil, bad("the store is local: no host (three slashes: file:///dir)")
	}
	dir := u.Path
	if u.Opaque != "" {
		d, err := url.PathUnescape(u.Opaque)
		if err != nil {
			return nil, bad("malformed path")
		}
		dir = d
	}
	if dir == "" {
		return nil, bad("no directory")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("filelock: open: %w", err)
	}
	return New(dir, append([]Option{WithSync(sync)}, opts...)...)
}
