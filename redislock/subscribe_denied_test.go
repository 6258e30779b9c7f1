package redislock

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
)

// waitRequests are the commands a waiter sends itself: its tries, and the
// subscription's SUBSCRIBE, PING (the confirmation, the health check) and
// UNSUBSCRIBE. The scripts' own calls (GET, ZADD, ...) are counted apart
// by the server, and left out.
var waitRequests = []string{"evalsha", "eval", "subscribe", "unsubscribe", "ping"}

// commandCount is how many of cmds the server ran or refused (INFO
// commandstats: calls plus rejected_calls), all clients together.
func commandCount(t *testing.T, admin *redis.Client, cmds ...string) int64 {
	t.Helper()
	m, err := admin.InfoMap(testCtx(t), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	var n int64
	for _, c := range cmds {
		for _, kv := range strings.Split(m["Commandstats"]["cmdstat_"+c], ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k == "calls" || k == "rejected_calls" {
				x, _ := strconv.ParseInt(v, 10, 64)
				n += x
			}
		}
	}
	return n
}

// A waiter whose ACL user may not SUBSCRIBE (no +subscribe, or no rule
// for the release channel: docs/backends/redislock.md says waiting still
// works, by polling) polls at a backoff's pace, in both modes: it does not
// try again at once after each refused subscription (the plain mode did,
// and the server ran 20,000-31,000 commands a second for one waiter). The
// plain mode says once per wait that it polls, and the waiter still gets
// the lock when the holder releases it.
//
// The limit: the plain mode's polling backoff doubles from 25ms to 250ms,
// each pause drawn from [d/2, d], so past its first pauses it tries at most
// once every 125ms: 8 tries a second, at most 13 in the window of 1.5 s. The
// failed subscription's channel lingers a second before it goes: meanwhile
// the connection's health check may send a PING and, finding the channel
// unsubscribed, SUBSCRIBE it again on a new connection (refused), a few
// requests more. Fair mode renews its place every livenessTTL/3. So a
// polling waiter sends fewer than 20 requests in 1.5 s; the limit, 20 a
// second, leaves a margin of about half of that.
//
// It counts on the secured instance, which only this package's tests use,
// one at a time: the server's counts are this test's. (The plain instance
// serves every package at once under go test ./....)
func TestSecureSubscribeDeniedPolls(t *testing.T) {
	s := newSecured(t)
	const (
		settle = 300 * time.Millisecond // the waiter's first tries and failed subscription
		window = 1500 * time.Millisecond
		limit  = 20.0 // requests a second (see above)
	)
	for _, fair := range []bool{false, true} {
		for _, c := range []struct {
			what string
			drop func(rule string) bool
		}{
			{"no +subscribe", func(r string) bool { return r == "+subscribe" }},
			{"no channel rule", func(r string) bool { return strings.HasPrefix(r, "&") }},
		} {
			t.Run(modeName(fair)+"/"+c.what, func(t *testing.T) {
				ctx := testCtx(t)
				ns := "sec-" + randHex(4)
				user, pw := s.user(t, aclWithout(ns, fair, c.drop))
				var logs logBuf
				type waiterDriver interface {
					backend.Driver
					backend.Queuer
				}
				open := func(opts ...Option) waiterDriver {
					t.Helper()
					var d waiterDriver
					var err error
					if fair {
						d, err = OpenFair(ctx, s.url(user, pw), opts...)
					} else {
						d, err = Open(ctx, s.url(user, pw), opts...)
					}
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { d.Close() })
					return d
				}
				holder, waiter := open(), open(WithLogger(logs.logger()))
				key := backend.Key(ns, "job")
				held := backend.Claim{Key: key, Token: newToken(), Owner: "holder", TTL: 10 * time.Second}
				if _, err := holder.TryAcquire(ctx, held); err != nil {
					t.Fatalf("the holder: %v", err)
				}
				got := make(chan error, 1)
				go func() {
					l := backend.Claim{Key: key, Token: newToken(), Owner: "waiter", TTL: 10 * time.Second}
					_, err := queueAcquire(ctx, waiter, l)
					if err == nil {
						err = waiter.Release(ctx, l)
					}
					got <- err
				}()
				time.Sleep(settle)
				before, start := commandCount(t, s.admin, waitRequests...), time.Now()
				time.Sleep(window)
				n := commandCount(t, s.admin, waitRequests...) - before
				rate := float64(n) / time.Since(start).Seconds()
				t.Logf("%d requests (%s) in %v while one waiter waits: %.1f a second",
					n, strings.Join(waitRequests, ", "), time.Since(start).Round(time.Millisecond), rate)
				if rate > limit {
					t.Errorf("%.0f requests a second while one waiter waits, want at most %v", rate, limit)
				}
				if err := holder.Release(ctx, held); err != nil {
					t.Fatalf("the holder's release: %v", err)
				}
				select {
				case err := <-got:
					if err != nil {
						t.Fatalf("the waiter: %v", err)
					}
				case <-time.After(3 * time.Second):
					t.Fatal("the waiter did not get the released lock within 3s")
				}
				if n := logs.count("notifications unavailable"); !fair && n != 1 {
					t.Errorf("%d warnings that the waiter polls, want one:\n%s", n, &logs)
				}
			})
		}
	}
}
