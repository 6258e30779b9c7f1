package redislock

import (
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// A default mode release with nobody waiting or watching publishes nothing;
// once the key is watched (Subscribe), every release is told, also after
// the watch's mark outlived its first expiry by its renewals; and when the
// last watcher stops, the mark goes.
func TestReleaseTellsWatchers(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	d := openDriver(t)
	key := uniqueKey(t)
	k := keysFor(key)
	// A bystander on the channel itself, to see every message.
	admin := adminClient(t, testenv.RedisAddr())
	ps := admin.Subscribe(ctx, k.channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := ps.Channel()
	cycle := func() {
		t.Helper()
		l := backend.Claim{Key: key, Token: newToken(), TTL: time.Minute}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	quiet := func(what string) {
		t.Helper()
		select {
		case m := <-msgs:
			t.Fatalf("%s: a release published %q", what, m.Payload)
		case <-time.After(100 * time.Millisecond):
		}
	}
	told := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-msgs:
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: the release was not published", what)
		}
		select {
		case <-ch:
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: the watcher was not woken", what)
		}
	}
	cycle()
	quiet("unwatched")

	ch, stop, err := d.Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	cycle()
	told("watched", ch)
	time.Sleep(2*livenessTTL + watchEvery)
	cycle()
	told("watched past the mark's first expiry", ch)

	stop()
	deadline := time.Now().Add(2*livenessTTL + 2*watchEvery)
	for admin.Exists(ctx, k.live).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the mark outlived its last watcher")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cycle()
	quiet("no longer watched")
}
