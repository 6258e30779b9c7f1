package redislock

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// A server that refuses our password or a command locking needs gives
// ErrPermission at once: at Open for the password, at the first try for
// the command, and a blocking Acquire does not wait it out as a transient
// error. No secret shows in the errors.
func TestPermissionErrorsArePermanent(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	admin := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer admin.Close()
	user := "lockertest-" + randHex(6)
	const pw = "Canary-" + "pw-7Qx"
	// May connect and PING, nothing else: no EVALSHA, no keys.
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pw, "-@all", "+ping", "+hello", "+auth", "+config|get").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "ACL", "DELUSER", user)

	_, err := Open(ctx, "redis://"+user+":wrong-"+pw+"@"+testenv.RedisAddr()+"/0")
	if !errors.Is(err, backend.ErrPermission) || strings.Contains(err.Error(), pw) {
		t.Fatalf("Open with a wrong password = %v, want ErrPermission without the password", err)
	}

	c, err := locker.Open(ctx, "redis://"+user+":"+pw+"@"+testenv.RedisAddr()+"/0?restart_delay=0")
	if err != nil {
		t.Fatalf("Open as a user that may only PING: %v", err)
	}
	defer c.Close()
	start := time.Now()
	_, err = c.Acquire(ctx, "x")
	if !errors.Is(err, locker.ErrPermission) {
		t.Fatalf("Acquire without the permission = %v, want ErrPermission", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Acquire took %v to report a permission error: it retried it as transient", took)
	}
	if strings.Contains(err.Error(), pw) || strings.Count(err.Error(), "not permitted") != 1 {
		t.Fatalf("Acquire's error says too much or repeats itself: %v", err)
	}
	t.Logf("Acquire: %v", err)
}

// A user whose ACL has the keys but not the release channels (Redis 7's
// default, resetchannels) still releases: the key is deleted and Release
// says so; the refused wake-up is logged once, and waiters poll.
func TestReleaseWithoutChannelPermission(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	admin := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer admin.Close()
	user := "lockertest-" + randHex(6)
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "resetchannels", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(context.Background(), "ACL", "DELUSER", user)
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	for _, fair := range []bool{false, true} {
		u := "redis://" + user + ":pw@" + testenv.RedisAddr() + "/0?restart_delay=0"
		var d backend.Driver
		var err error
		if fair {
			d, err = OpenFair(ctx, u, WithLogger(log))
		} else {
			d, err = Open(ctx, u, WithLogger(log))
		}
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		for range 2 {
			l := backend.Claim{Key: uniqueKey(t), Token: newToken(), TTL: time.Minute}
			if _, err := d.TryAcquire(ctx, l); err != nil {
				t.Fatalf("fair=%v: TryAcquire: %v", fair, err)
			}
			// The default mode publishes only to waiters and watchers
			// (notify.go, watchMark): a watcher elsewhere, by hand.
			live := keysFor(l.Key).live
			if err := admin.HSet(ctx, live, watchField, "1").Err(); err != nil {
				t.Fatal(err)
			}
			admin.PExpire(ctx, live, time.Minute)
			if err := d.Release(ctx, l); err != nil {
				t.Fatalf("fair=%v: Release without channel permission = %v, want success", fair, err)
			}
			if n, err := admin.Exists(ctx, keysFor(l.Key).lock).Result(); err != nil || n != 0 {
				t.Fatalf("fair=%v: the lock key is still there (%d, %v)", fair, n, err)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "refuses PUBLISH"); n != 2 {
		t.Fatalf("%d warnings about the refused wake-up (one per driver wanted):\n%s", n, logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
