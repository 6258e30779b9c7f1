package memlock

import (
	"context"
	"fmt"
	"net/url"

	"github.com/lockerhq/locker/backend"
)

func init() {
	backend.Register("mem", backend.OpenerFunc("mem://[NAME]  (in-process; drivers opened with the same NAME share locks)", openURL))
}

// Open returns a driver on the process-wide Store that a mem://[NAME] URL
// names (see [Named]). Drivers opened with the same NAME share locks.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := backend.ParseURL(rawURL, "mem")
	if err != nil {
		return nil, fmt.Errorf("memlock: %w", err)
	}
	return openURL(ctx, u)
}

// openURL is Open for a parsed URL; the registry's opener calls it too.
func openURL(ctx context.Context, u *url.URL) (*Driver, error) {
	if err := backend.NewParams(u).Err(); err != nil {
		return nil, fmt.Errorf("memlock: %w", err)
	}
	if u.Path != "" && u.Path != "/" || u.User != nil || u.Port() != "" {
		return nil, fmt.Errorf("memlock: %w: want mem://[NAME]", backend.ErrInvalidURL)
	}
	return New(Named(u.Host))
}
