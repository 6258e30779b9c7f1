package mysql

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
)

// A client cut off without a FIN in the middle of a semaphore's
// transaction, holding the object's anchor lock, holds up the object's
// grants no longer than the sessions' wait_timeout, not the server's
// default 8 hours. Not parallel: it sets waitTimeout, which every Open
// reads.
func TestSilentClientFreesObject(t *testing.T) {
	defer func(d time.Duration) { waitTimeout = d }(waitTimeout)
	waitTimeout = 3 * time.Second
	h := newHarness(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	u, err := url.Parse(h.url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	u.Host = p.Addr()
	cut, err := Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	other, err := Open(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	permit := func() backend.Claim {
		return backend.Claim{Key: "silent/s", Token: randHex(16), TTL: time.Minute, Mode: backend.Permit, Limit: 2, Weight: 1}
	}
	c := permit()
	g, err := cut.TryAcquire(ctx, c) // the statements prepared, the anchor made
	if err != nil {
		t.Fatal(err)
	}
	c.Fence = g.Fence
	if err := cut.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	// Every answer 200 ms late, then nothing either way: the transaction
	// has begun and locked the anchor when the partition comes.
	p.Delay(0, 200*time.Millisecond)
	time.AfterFunc(700*time.Millisecond, p.Blackhole)
	start := time.Now()
	if _, err := cut.TryAcquire(ctx, permit()); err == nil {
		t.Fatal("a grant through a partition succeeded")
	}
	t.Logf("the cut client gave up after %v", time.Since(start))
	tctx, tcancel := context.WithTimeout(ctx, 4*waitTimeout)
	defer tcancel()
	for {
		_, err := other.TryAcquire(tctx, permit())
		if err == nil {
			break
		}
		if tctx.Err() != nil {
			t.Fatalf("the semaphore is still held up %v after the partition, wait_timeout %v: %v", time.Since(start), waitTimeout, err)
		}
	}
	t.Logf("another client took a permit %v after the partition", time.Since(start))
}
