package redislock

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// A server that started less than a TTL ago grants no new name: it may
// have forgotten a holder that runs until its TTL ends. The name is
// granted once the server has run for the TTL, and at once with the check
// off.
func TestYoungServerWaitsATTL(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	began := time.Now()
	srv := testenv.StartRedis(t)
	const ttl = 3 * time.Second
	for _, fair := range []bool{false, true} {
		u := "redis://" + srv.Addr + "/0"
		var d backend.Driver
		var err error
		if fair {
			d, err = OpenFair(ctx, u, withTTLRestartDelay())
		} else {
			d, err = Open(ctx, u, withTTLRestartDelay())
		}
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: ttl}
		_, err = d.TryAcquire(ctx, l)
		if !errors.Is(err, backend.ErrNotAcquired) || !strings.Contains(err.Error(), "started less than a TTL ago") {
			t.Fatalf("fair=%v: TryAcquire on a server started %v ago = %v, want ErrNotAcquired saying why",
				fair, time.Since(began), err)
		}
	}
	off, err := Open(ctx, "redis://"+srv.Addr+"/0?restart_delay=0")
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	if _, err := off.TryAcquire(ctx, backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: ttl}); err != nil {
		t.Fatalf("with restart_delay=0: %v", err)
	}
	d, err := Open(ctx, "redis://"+srv.Addr+"/0", withTTLRestartDelay())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: ttl}
	for i := 0; ; i++ {
		_, err := d.TryAcquire(ctx, l)
		if err == nil {
			break
		}
		if !errors.Is(err, backend.ErrNotAcquired) || time.Since(began) > ttl+5*time.Second {
			t.Fatalf("TryAcquire %v after the start: %v", time.Since(began), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The server started after began: it has run for less than since.
	if since := time.Since(began); since < ttl {
		t.Fatalf("granted %v after the server's start, less than the TTL %v", since, ttl)
	}
	t.Logf("granted %v after the server's start (TTL %v)", time.Since(began), ttl)
}
