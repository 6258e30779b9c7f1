package memcachelock

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// memcached has no authentication: any client that reaches the port can
// delete or overwrite a held lock's item. The holder's Lost fires by the
// end of the first refresh sent after that, which the watchdog sends at
// most TTL/3 after the one before it: within TTL/3 and a round trip.
func TestTheftIsNoticed(t *testing.T) {
	addr := testenv.MemcacheAddr()
	testenv.Require(t, addr)
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	d, err := Open(ctx, "memcache://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	spy := &testenv.RefreshSpy{Driver: d}
	ns := "mctest-" + randHex(4)
	c, err := locker.New(spy, locker.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	thief := memcache.New(addr)
	defer thief.Close()
	const ttl = time.Second // memcached's TTLs are whole seconds
	var worst time.Duration
	// The last two steal right after a refresh was answered: the worst
	// case, a whole TTL/3 before the next.
	for i, theft := range []string{"delete", "set", "delete", "set", "delete", "set", "delete", "set"} {
		name := fmt.Sprintf("job-%d", i)
		l, err := c.Acquire(ctx, name, locker.TTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		if l.TTL() != ttl {
			t.Fatalf("effective TTL %v, want %v", l.TTL(), ttl)
		}
		if i < 6 {
			// Steal at a different phase of the refresh cycle each time.
			time.Sleep(ttl/2 + time.Duration(i)*ttl/9)
		} else {
			spy.WaitRefreshed(t, time.Now())
		}
		key := lockKey(backend.Key(ns, name))
		at := time.Now()
		if theft == "delete" {
			err = thief.Delete(key)
		} else {
			err = thief.Set(&memcache.Item{Key: key, Value: []byte("thief"), Expiration: 60})
		}
		if err != nil {
			t.Fatalf("%s: %v", theft, err)
		}
		worst = max(worst, spy.ExpectLost(t, theft, l.Lost(), at, ttl))
		if !errors.Is(l.Err(), locker.ErrLost) {
			t.Errorf("%s: Err() = %v", theft, l.Err())
		}
		if err := l.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
			t.Errorf("%s: Release after the theft = %v, want ErrNotHeld", theft, err)
		}
		if theft == "set" {
			if it, err := thief.Get(key); err != nil || string(it.Value) != "thief" {
				t.Errorf("the holder's release touched the thief's item (%v)", err)
			}
		}
	}
	t.Logf("TTL %v: worst time from theft to Lost %v (TTL/3 = %v)", ttl, worst.Round(time.Millisecond), ttl/3)
}
