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

// A server restarted from a snapshot (RDB, the default persistence, or an
// AOF that missed its last second) remembers the fence counters from
// before the snapshot but not the grants after it: it must wait out the
// TTL as a server without persistence does, or the holders it forgot have
// second ones beside them. A lock, a permit and a set of two names.
func TestRestartFromSnapshotWaitsATTL(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	srv := testenv.StartRedis(t)
	admin := adminClient(t, srv.Addr)
	d, err := Open(ctx, "redis://"+srv.Addr+"/0?restart_delay=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	key := uniqueKey(t)
	claims := func() []backend.Claim {
		return []backend.Claim{
			{Key: key, Token: newToken(), TTL: time.Minute},
			{Key: key, Token: newToken(), TTL: time.Minute, Mode: backend.Permit, Limit: 1},
			{Key: key + "/a", Token: newToken(), TTL: time.Minute},
			{Key: key + "/b", Token: newToken(), TTL: time.Minute},
		}
	}
	take := func(cs []backend.Claim) error {
		for _, c := range cs[:2] {
			if _, err := d.TryAcquire(ctx, c); err != nil {
				return err
			}
		}
		_, err := d.TryAcquireAll(ctx, cs[2:])
		return err
	}
	a := claims()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := take(a); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("a new server's first grants: %v", err)
		}
	}
	for _, c := range a {
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Save(ctx).Err(); err != nil { // the counters, no holder
		t.Fatal(err)
	}
	if err := take(claims()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil { // SIGKILL: the snapshot stays as saved
		t.Fatal(err)
	}
	if n, err := admin.Exists(ctx, keysFor(key).fence, sharedKeys(a[1])[2]).Result(); err != nil || n != 2 {
		t.Fatalf("the snapshot's counters after the restart: %d, %v", n, err)
	}
	b := claims()
	for i, one := range [][]backend.Claim{b[:1], b[1:2], b[2:]} {
		for range 3 { // the first calls may meet the killed connections
			if len(one) == 1 {
				_, err = d.TryAcquire(ctx, one[0])
			} else {
				_, err = d.TryAcquireAll(ctx, one)
			}
			if err == nil || errors.Is(err, backend.ErrNotAcquired) {
				break
			}
		}
		if err == nil {
			t.Fatalf("claim %d: a server restarted from a snapshot granted at once what it forgot the holder of", i)
		}
		if !errors.Is(err, backend.ErrNotAcquired) || !strings.Contains(err.Error(), "started less than a TTL ago") {
			t.Fatalf("claim %d: TryAcquire after the restart: %v, want ErrNotAcquired saying why", i, err)
		}
	}
}
