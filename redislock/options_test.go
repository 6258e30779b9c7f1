package redislock

import (
	"context"
	"testing"
	"time"

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
		if d, err := New(rdb, o); err == nil {
			d.Close()
			t.Errorf("%s: New succeeded", name)
		}
		if d, err := NewFair(rdb, o); err == nil {
			d.Close()
			t.Errorf("%s: NewFair succeeded", name)
		}
		if q, err := NewQuorum([]redis.UniversalClient{rdb}, o); err == nil {
			q.Close()
			t.Errorf("%s: NewQuorum succeeded", name)
		}
		if d, err := Open(ctx, "redis://127.0.0.1:1/0", o); err == nil {
			d.Close()
			t.Errorf("%s: Open succeeded", name)
		}
		if q, err := OpenQuorum(ctx, "redis+quorum://127.0.0.1:1/0", o); err == nil {
			q.Close()
			t.Errorf("%s: OpenQuorum succeeded", name)
		}
	}
	if _, err := New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	if _, err := NewFair(nil); err == nil {
		t.Error("NewFair(nil) succeeded")
	}
	// In range: accepted.
	d, err := New(rdb, WithRestartDelay(0), WithClockDrift(0, 0), WithLogger(nil))
	if err != nil {
		t.Fatalf("New with options in range: %v", err)
	}
	d.Close()
}
