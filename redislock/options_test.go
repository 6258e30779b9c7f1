package redislock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/redis/go-redis/v9"
)

// An option given a value out of its range, or a nil client, fails the
// constructors before any network call (the address is never dialed).
func TestBadOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	bad := map[string]Option{
		"negative restart delay": WithRestartDelay(-time.Second),
		"drift factor too large": WithClockDrift(0.5, 0),
		"negative drift factor":  WithClockDrift(-0.1, 0),
		"negative fixed drift":   WithClockDrift(0.01, -time.Millisecond),
		"zero retention":         WithRetention(0),
		"negative retention":     WithRetention(-time.Hour),
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for name, o := range bad {
		if d, err := New(rdb, o); !errors.Is(err, backend.ErrInvalidOption) {
			d.Close()
			t.Errorf("%s: New: %v, want ErrInvalidOption", name, err)
		}
		if d, err := NewFair(rdb, o); !errors.Is(err, backend.ErrInvalidOption) {
			d.Close()
			t.Errorf("%s: NewFair: %v, want ErrInvalidOption", name, err)
		}
		if q, err := NewQuorum([]redis.UniversalClient{rdb}, o); !errors.Is(err, backend.ErrInvalidOption) {
			q.Close()
			t.Errorf("%s: NewQuorum: %v, want ErrInvalidOption", name, err)
		}
		if d, err := Open(ctx, "redis://127.0.0.1:1/0", o); !errors.Is(err, backend.ErrInvalidOption) {
			d.Close()
			t.Errorf("%s: Open: %v, want ErrInvalidOption", name, err)
		}
		if q, err := OpenQuorum(ctx, "redis+quorum://127.0.0.1:1/0", o); !errors.Is(err, backend.ErrInvalidOption) {
			q.Close()
			t.Errorf("%s: OpenQuorum: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := New(nil); !errors.Is(err, backend.ErrInvalidOption) {
		t.Errorf("New(nil): %v, want ErrInvalidOption", err)
	}
	if _, err := NewFair(nil); !errors.Is(err, backend.ErrInvalidOption) {
		t.Errorf("NewFair(nil): %v, want ErrInvalidOption", err)
	}
	if _, err := NewQuorum([]redis.UniversalClient{rdb, nil, rdb}); !errors.Is(err, backend.ErrInvalidOption) {
		t.Errorf("NewQuorum with a nil client: %v, want ErrInvalidOption", err)
	}
	// In range: accepted.
	d, err := New(rdb, WithRestartDelay(0), WithClockDrift(0, 0), WithLogger(nil))
	if err != nil {
		t.Fatalf("New with options in range: %v", err)
	}
	d.Close()
}
