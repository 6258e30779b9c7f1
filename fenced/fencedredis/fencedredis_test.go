package fencedredis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/fenced/fencedredis"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/memlock"
)

// A holder paused past its TTL wakes after the next holder has written:
// its guarded write is refused, the later one stays; unguarded, the stale
// write lands over it.
func TestPausedHolderRefused(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	tag := "{fenced-" + testutil.RandHex(4) + "}"
	fk, key := tag+":fence", tag+":balance"
	defer rdb.Del(context.Background(), fk, key)

	store := memlock.NewStore()
	a, b := client(t, store), client(t, store)
	la, err := a.Acquire(ctx, "account", locker.TTL(300*time.Millisecond), locker.AutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fencedredis.Do(ctx, rdb, fk, la.Fence(), "SET", key, "a"); err != nil {
		t.Fatalf("a's write while it holds the lock: %v", err)
	}
	lb, err := b.Acquire(ctx, "account") // after a's TTL: a is paused
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Release(ctx)
	if _, err := fencedredis.Do(ctx, rdb, fk, lb.Fence(), "SET", key, "b"); err != nil {
		t.Fatalf("b's write: %v", err)
	}
	if _, err := fencedredis.Do(ctx, rdb, fk, la.Fence(), "SET", key, "a-late"); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("a's write after b's: %v, want ErrStale", err)
	}
	if v, err := fencedredis.Do(ctx, rdb, fk, lb.Fence(), "GET", key); err != nil || v != "b" {
		t.Fatalf("b reads %v, %v; want b", v, err)
	}
	rdb.Set(ctx, key, "a-late", 0) // bypassed
	if v := rdb.Get(ctx, key).Val(); v != "a-late" {
		t.Fatalf("unguarded, the key holds %q; want the stale write to land", v)
	}
	// Fences above 2^53 compare exactly.
	if _, err := fencedredis.Do(ctx, rdb, fk, 1<<62+1, "SET", key, "big"); err != nil {
		t.Fatal(err)
	}
	if _, err := fencedredis.Do(ctx, rdb, fk, 1<<62, "SET", key, "below"); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("2^62 after 2^62+1: %v, want ErrStale", err)
	}
	for _, c := range []struct {
		fk, key string
		fence   uint64
	}{{fk, key, 0}, {"", key, 1}, {fk, "", 1}, {key, key, 1}} {
		if _, err := fencedredis.Do(ctx, rdb, c.fk, c.fence, "SET", c.key, "x"); !errors.Is(err, fenced.ErrInvalid) {
			t.Errorf("Do(%q, %d, SET %q): %v, want ErrInvalid", c.fk, c.fence, c.key, err)
		}
	}
}

func client(t *testing.T, s *memlock.Store) *locker.Client {
	d, err := memlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	c, err := locker.New(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
