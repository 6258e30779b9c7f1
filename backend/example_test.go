package backend_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A third-party driver's skeleton: the helpers it should use so that it
// behaves like the drivers of this module. Its store is left out.
type Driver struct {
	gate  backend.Gate // ErrClosed after Close; Close waits for calls in flight
	hosts []string
}

func (d *Driver) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.Grant{}, fmt.Errorf("mystore: %w", err)
	}
	defer done()
	_ = ctx // ... set c.Key to c.Token with expiry c.TTL, if absent ...
	return backend.Grant{}, fmt.Errorf("mystore: %w", backend.ErrNotAcquired)
}

func (d *Driver) Refresh(ctx context.Context, c backend.Claim) error { return backend.ErrNotHeld }
func (d *Driver) Release(ctx context.Context, c backend.Claim) error { return backend.ErrNotHeld }
func (d *Driver) Close() error {
	if !d.gate.Close() {
		return fmt.Errorf("mystore: %w", backend.ErrClosed)
	}
	return nil
}

// open reads a URL with the shared parsers: unknown parameters, an empty
// server in the list and a bad duration are all ErrInvalidURL, before any
// network call.
func open(_ context.Context, u *url.URL) (*Driver, error) {
	hosts, err := backend.Hosts(u, "7000")
	if err != nil {
		return nil, err
	}
	p := backend.NewParams(u)
	_ = p.Duration("dial_timeout", 5*time.Second)
	if err := p.Err(); err != nil {
		return nil, err
	}
	return &Driver{hosts: hosts}, nil
}

// Open is the driver's public Open: the same function the registry calls.
func Open(ctx context.Context, rawURL string) (*Driver, error) {
	u, err := backend.ParseURL(rawURL, "mystore")
	if err != nil {
		return nil, err
	}
	return open(ctx, u)
}

// A driver package registers its scheme in init, so that a blank import
// makes locker.Open("mystore://...") work, as database/sql drivers do.
func Example() {
	backend.Register("mystore", backend.OpenerFunc("mystore://host[:port][,host...]?dial_timeout=5s", open))

	u, err := url.Parse("mystore://a:7001,b:7002?dial_timeout=2s")
	if err != nil {
		panic(err)
	}
	drv, err := backend.Open(context.Background(), u)
	fmt.Println(drv.(*Driver).hosts, err)

	_, err = Open(context.Background(), "mystore://a,,b")
	fmt.Println(errors.Is(err, backend.ErrInvalidURL), backend.Permanent(err))
	// Output:
	// [a:7001 b:7002] <nil>
	// true true
}
