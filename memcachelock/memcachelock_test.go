package memcachelock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

var (
	randHex = testutil.RandHex
	token   = testutil.Token
)

// uniqueKey returns a key no other test (or run) uses.
func uniqueKey(t testing.TB, name string) string {
	return backend.Key("mctest-"+randHex(4), t.Name()+"/"+name)
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func openDriver(t testing.TB, addrs ...string) *Driver {
	t.Helper()
	d, err := Open(testCtx(t, 10*time.Second), "memcache://"+strings.Join(addrs, ","))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// mustNew is New on a client the test made.
func mustNew(t testing.TB, mc *memcache.Client, opts ...Option) *Driver {
	t.Helper()
	d, err := New(mc, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return d
}

func openClient(t testing.TB, addr string, opts ...locker.Option) *locker.Client {
	t.Helper()
	c, err := locker.Open(testCtx(t, 10*time.Second), "memcache://"+addr, opts...)
	if err != nil {
		t.Fatalf("locker.Open: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestExpiration(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	cases := []struct {
		ttl  time.Duration
		exp  int32
		eff  time.Duration
		fail bool
	}{
		{ttl: time.Nanosecond, exp: 3, eff: time.Second},
		{ttl: 500 * time.Millisecond, exp: 3, eff: time.Second},
		{ttl: time.Second, exp: 3, eff: time.Second},
		{ttl: 1001 * time.Millisecond, exp: 4, eff: 2 * time.Second},
		{ttl: 30 * time.Second, exp: 32, eff: 30 * time.Second},
		// The largest TTL sent as a relative expiration: 30 days - 2s + 2s.
		{ttl: maxTTL - 2*time.Second, exp: maxRelative, eff: maxTTL - 2*time.Second},
		// Above it memcached reads a Unix time.
		{ttl: maxTTL - 2*time.Second + 1, exp: int32(now.Unix()) + maxRelative + 1, eff: maxTTL - time.Second},
		{ttl: maxTTL, exp: int32(now.Unix()) + maxRelative + 2, eff: maxTTL},
		{ttl: maxTTL + 1, fail: true},
		{ttl: 0, fail: true},
		{ttl: -time.Second, fail: true},
	}
	for _, c := range cases {
		exp, eff, err := expiration(c.ttl, now)
		if c.fail {
			if !errors.Is(err, backend.ErrInvalidTTL) {
				t.Errorf("expiration(%v) = %d, %v, %v; want ErrInvalidTTL", c.ttl, exp, eff, err)
			}
			continue
		}
		if err != nil || exp != c.exp || eff != c.eff {
			t.Errorf("expiration(%v) = %d, %v, %v; want %d, %v", c.ttl, exp, eff, err, c.exp, c.eff)
		}
		if eff < c.ttl {
			t.Errorf("expiration(%v): effective TTL %v is shorter", c.ttl, eff)
		}
	}
	// After 2038 an absolute expiry does not fit gomemcache's int32.
	if _, _, err := expiration(maxTTL, time.Unix(1<<31, 0)); !errors.Is(err, backend.ErrInvalidTTL) {
		t.Errorf("expiration(30 days) in 2038 = %v, want ErrInvalidTTL", err)
	}
}

func TestKeys(t *testing.T) {
	long := strings.Repeat("ü", backend.MaxNameLen/2)
	keys := []string{
		backend.Key("ns", "a"), backend.Key("ns", "a:f"), backend.Key("ns", "a b\x01\n"),
		backend.Key(strings.Repeat("n", backend.MaxNamespaceLen), long),
		backend.Key(strings.Repeat("n", backend.MaxNamespaceLen), long[:len(long)-2]+"x"),
	}
	seen := map[string]string{}
	for _, k := range keys {
		for _, ik := range []string{lockKey(k), fenceKey(k)} {
			if len(ik) > 250 {
				t.Errorf("item key for %q is %d bytes", k, len(ik))
			}
			for i := 0; i < len(ik); i++ {
				if ik[i] <= ' ' || ik[i] == 0x7f {
					t.Errorf("item key %q has byte %#x", ik, ik[i])
				}
			}
			if prev, dup := seen[ik]; dup {
				t.Errorf("keys %q and %q share the item %q", prev, k, ik)
			}
			seen[ik] = k
		}
	}
}

func TestValues(t *testing.T) {
	tok := token()
	for _, c := range []struct {
		v    []byte
		held bool
	}{
		{holdValue(tok, ""), true},
		{holdValue(tok, "job 7"), true},
		{holdValue(tok, strings.Repeat("o", 1000)), true},
		{holdValue(token(), ""), false},
		{[]byte(tok + "x"), false},
		{[]byte(tok[:31]), false},
		{[]byte(tombstone), false},
	} {
		if got := heldBy(c.v, tok); got != c.held {
			t.Errorf("heldBy(%q) = %v, want %v", c.v, got, c.held)
		}
	}
	if n := len(holdValue(tok, strings.Repeat("o", 1000))); n != tokenLen+len(" ~0 ")+maxOwnerLen {
		t.Errorf("value with a long owner is %d bytes", n)
	}
	// Tokens of other lengths work too; ones a value cannot carry do not.
	if !heldBy([]byte("abc job"), "abc") || heldBy([]byte("abcd"), "abc") || heldBy([]byte("ab"), "abc") {
		t.Error("a short token misread")
	}
	for _, bad := range []string{"", "a b", tombstone, "a\x00"} {
		if heldBy([]byte(bad), bad) || !errors.Is(checkToken(bad), backend.ErrUnsupported) {
			t.Errorf("token %q accepted", bad)
		}
		d := mustNew(t, memcache.New("127.0.0.1:1")) // never reached
		if _, err := d.TryAcquire(context.Background(), backend.Claim{Key: "a/b", Token: bad, TTL: time.Second}); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("TryAcquire with token %q = %v, want ErrUnsupported", bad, err)
		}
	}
	if heldBy([]byte(tombstone), "") || !isTombstone([]byte(tombstone)) || isTombstone(holdValue(tok, "")) {
		t.Error("tombstone misread")
	}
	// Fence and owner, in values of this version and of older ones; a
	// piped fence settles into a plain one.
	for _, c := range []struct {
		v     []byte
		fence uint64
		piped bool
		owner string
	}{
		{fencedValue(tok, 17, "job 7"), 17, false, "job 7"},
		{fencedValue(tok, 1<<63, ""), 1 << 63, false, ""},
		{fencedValue(tok, 0, "~5"), 0, false, "~5"}, // no fence yet
		{holdValue(tok, "job 7"), 0, false, "job 7"},
		{holderValue(tok, pipedMark, 17, "^3 x"), 17, true, "^3 x"},
		{append(holderValue(tok, pipedMark, 17, ""), markSep+"d1"...), 17, true, ""},
		{[]byte(tok), 0, false, ""},
		{[]byte(tok + " ~x y"), 0, false, "~x y"},
		{[]byte(tok + " ^x y"), 0, false, "^x y"},
	} {
		if !heldBy(c.v, tok) {
			t.Errorf("heldBy(%q) = false", c.v)
		}
		if fence, piped, owner := parseValue(c.v); fence != c.fence || piped != c.piped || owner != c.owner {
			t.Errorf("parseValue(%q) = %d, %v, %q, want %d, %v, %q", c.v, fence, piped, owner, c.fence, c.piped, c.owner)
		}
		v := bytes.Clone(c.v)
		settle(v)
		if fence, piped, owner := parseValue(v); fence != c.fence || piped || owner != c.owner || len(v) != len(c.v) {
			t.Errorf("settled %q: %q", c.v, v)
		}
	}
}

func TestParseURL(t *testing.T) {
	good := map[string][]string{
		"memcache://h1:1,h2:2":          {"h1:1", "h2:2"},
		"memcache://h1,10.0.0.1":        {"h1:11211", "10.0.0.1:11211"},
		"memcache://[::1]:11212":        {"[::1]:11212"},
		"memcache://[::1]":              {"[::1]:11211"},
		"memcache:///run/memcache.sock": {"/run/memcache.sock"},
		"memcache://h1:1/":              {"h1:1"},
	}
	for raw, want := range good {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("url.Parse(%q): %v", raw, err)
		}
		got, err := parseServers(u)
		if err != nil || strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("parseServers(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	for _, raw := range []string{"memcache://", "memcache://h1,,h2", "memcache://user:secret@h1", "memcache://h1/db"} {
		u, _ := url.Parse(raw)
		_, err := parseServers(u)
		if !errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("parseServers(%q) = %v, want ErrInvalidURL", raw, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("error shows the password: %v", err)
		}
	}
}

func TestOpenBadParams(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	for _, q := range []string{"bogus=1", "timeout=fast", "timeout=0s", "max_idle=0", "max_idle=x", "retention=0s", "retention=-1s", "retention=721h", "retention=long"} {
		_, err := locker.Open(ctx, "memcache://127.0.0.1:1?"+q)
		if !errors.Is(err, locker.ErrInvalidURL) {
			t.Errorf("Open with %s = %v, want ErrInvalidURL", q, err)
		}
	}
}

// Bad options fail before any network call, with ErrInvalidOption.
func TestBadOptions(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	mc := memcache.New("127.0.0.1:1") // never reached
	for name, f := range map[string]func() (*Driver, error){
		"New(nil)":                 func() (*Driver, error) { return New(nil) },
		"New WithTimeout":          func() (*Driver, error) { return New(mc, WithTimeout(time.Second)) },
		"New WithMaxIdle":          func() (*Driver, error) { return New(mc, WithMaxIdle(4)) },
		"New WithRestartDelay(-1)": func() (*Driver, error) { return New(mc, WithRestartDelay(-1)) },
		"Open WithTimeout(0)":      func() (*Driver, error) { return Open(ctx, "memcache://127.0.0.1:1", WithTimeout(0)) },
		"Open WithMaxIdle(0)":      func() (*Driver, error) { return Open(ctx, "memcache://127.0.0.1:1", WithMaxIdle(0)) },
		"New WithRetention(0)":     func() (*Driver, error) { return New(mc, WithRetention(0)) },
		"New WithRetention(31d)":   func() (*Driver, error) { return New(mc, WithRetention(31*24*time.Hour)) },
		"Open WithRetention(-1)":   func() (*Driver, error) { return Open(ctx, "memcache://127.0.0.1:1", WithRetention(-1)) },
	} {
		if d, err := f(); !errors.Is(err, backend.ErrInvalidOption) || d != nil || errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("%s = %v, %v; want ErrInvalidOption", name, d, err)
		}
	}
	if _, err := Open(ctx, "redis://127.0.0.1:1"); !errors.Is(err, backend.ErrInvalidURL) {
		t.Errorf("Open(redis://) = %v, want ErrInvalidURL", err)
	}
	d, err := New(mc, WithRestartDelay(time.Second))
	if err != nil || d.restartMax != time.Second {
		t.Errorf("New WithRestartDelay(1s): %v, restartMax %v", err, d.restartMax)
	}
	if d, err := New(mc, WithRetention(1500*time.Millisecond)); err != nil || d.fenceExp != 2 {
		t.Errorf("New WithRetention(1.5s): %v, counters expire after %ds, want 2s", err, d.fenceExp)
	}
	if d, err := New(mc); err != nil || d.fenceExp != 24*60*60 {
		t.Errorf("New: %v, counters expire after %ds, want 24h", err, d.fenceExp)
	}
}

func TestOpenUnreachableFailsFast(t *testing.T) {
	// A port nothing listens on: refused at once. The timeout bounds a
	// silent host the same way.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	start := time.Now()
	_, err = locker.Open(testCtx(t, 10*time.Second), "memcache://"+addr+"?timeout=300ms")
	if err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Open took %v to fail", took)
	}
	// A server that accepts but never answers: the timeout bounds it.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	start = time.Now()
	_, err = locker.Open(testCtx(t, 10*time.Second), "memcache://"+ln.Addr().String()+"?timeout=300ms")
	if err == nil {
		t.Fatal("Open of a silent server succeeded")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Open took %v to fail on a silent server", took)
	}
	// The context's deadline bounds it too.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := locker.Open(ctx, "memcache://"+ln.Addr().String()+"?timeout=10s"); err == nil {
		t.Fatal("Open of a silent server succeeded")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Open took %v to fail with a 200ms context", took)
	}
}

func TestTombstoneIsFree(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	// A server that kept a released lock's tombstone (memcached does not:
	// the negative expiration removes it).
	if err := d.mc.Set(&memcache.Item{Key: lockKey(key), Value: []byte(tombstone), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	l := backend.Claim{Key: key, Token: token(), TTL: time.Second}
	g, err := d.TryAcquire(ctx, l)
	if err != nil {
		t.Fatalf("TryAcquire over a tombstone: %v", err)
	}
	if g.Fence == 0 || g.TTL != time.Second {
		t.Fatalf("grant %+v", g)
	}
	if _, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: token(), TTL: time.Second}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("second TryAcquire = %v, want ErrNotAcquired", err)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// The release leaves nothing behind.
	if it, err := d.mc.Get(lockKey(key)); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("after Release, Get = %+v, %v; want a miss", it, err)
	}
}

func TestForeignValueCountsAsHeld(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	if err := d.mc.Set(&memcache.Item{Key: lockKey(key), Value: []byte("something else"), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	defer d.mc.Delete(lockKey(key))
	if _, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: token(), TTL: time.Second}); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire over a value we did not write = %v, want ErrNotAcquired", err)
	}
	if it, err := d.mc.Get(lockKey(key)); err != nil || string(it.Value) != "something else" {
		t.Fatalf("the value was changed: %v %v", it, err)
	}
}

// The effective TTL is honoured by the real server: a lock lives at least
// its effective TTL and is free at most about two seconds after it, whatever
// the phase of memcached's once-a-second clock at the store.
func TestTTLRoundedUp(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	const n = 10 // stores spread over one second
	lived := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		time.Sleep(time.Second / n)
		wg.Go(func() {
			key := uniqueKey(t, fmt.Sprint(i))
			start := time.Now()
			g, err := d.TryAcquire(ctx, backend.Claim{Key: key, Token: token(), TTL: 300 * time.Millisecond})
			if err != nil {
				errs[i] = err
				return
			}
			if g.TTL != time.Second {
				errs[i] = fmt.Errorf("effective TTL %v, want 1s", g.TTL)
				return
			}
			for {
				_, err := d.get(context.Background(), lockKey(key))
				if errors.Is(err, memcache.ErrCacheMiss) {
					break
				}
				if err != nil {
					errs[i] = err
					return
				}
				if time.Since(start) > 5*time.Second {
					errs[i] = errors.New("the lock outlived its TTL by 4s")
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			lived[i] = time.Since(start)
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if lived[i] < time.Second {
			t.Errorf("a lock with TTL 300ms (effective 1s) lived %v, less than its effective TTL", lived[i])
		}
		if lived[i] > time.Second+expirationMargin*time.Second+500*time.Millisecond {
			t.Errorf("a lock with TTL 300ms (effective 1s) lived %v, more than its TTL and the granularity", lived[i])
		}
	}
	t.Logf("locks with TTL 300ms (effective 1s) lived %v", lived)
}

// The longest TTL, sent to memcached as an absolute Unix time, is honoured.
func TestLongestTTL(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	// A server that started less than 720h ago refuses a new name for
	// that long unless told otherwise (restart.go).
	c := openClient(t, testenv.MemcacheAddr()+"?restart_delay=1s", locker.WithNamespace("mctest-"+randHex(4)))
	l, err := c.TryAcquire(ctx, "long", locker.TTL(locker.MaxTTL), locker.AutoRefresh(false))
	if err != nil {
		t.Fatalf("TryAcquire with TTL %v: %v", locker.MaxTTL, err)
	}
	if l.TTL() != locker.MaxTTL {
		t.Fatalf("effective TTL %v", l.TTL())
	}
	time.Sleep(1500 * time.Millisecond) // an expiry misread as 1970 would be gone
	if err := l.Refresh(ctx); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func TestFenceSeededFromClock(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	before := uint64(time.Now().UnixMicro())
	l := backend.Claim{Key: key, Token: token(), TTL: time.Second}
	g, err := d.TryAcquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	if g.Fence < before || g.Fence > uint64(time.Now().UnixMicro()) {
		t.Fatalf("first fence %d, want the time in microseconds (between %d and now)", g.Fence, before)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	// Lose the counter (as an eviction would): the next fence is still larger.
	if err := d.mc.Delete(fenceKey(key)); err != nil {
		t.Fatal(err)
	}
	l2 := backend.Claim{Key: key, Token: token(), TTL: time.Second}
	g2, err := d.TryAcquire(ctx, l2)
	if err != nil {
		t.Fatal(err)
	}
	if g2.Fence <= g.Fence {
		t.Fatalf("fence %d after the counter was lost, %d before", g2.Fence, g.Fence)
	}
	d.Release(ctx, l2)
}

// Many concurrent first acquisitions of fresh keys race to seed counters;
// every fence of one key is distinct.
func TestConcurrentSeeding(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ds := []*Driver{openDriver(t, testenv.MemcacheAddr()), openDriver(t, testenv.MemcacheAddr())}
	key := uniqueKey(t, "x")
	var mu sync.Mutex
	fences := map[uint64]bool{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			d := ds[i%2]
			for r := range 5 {
				// Drop the counter twice to race the seeding (each drop
				// costs a caller at most one attempt of its four).
				if i == 0 && r < 2 {
					d.mc.Delete(fenceKey(key))
				}
				var fence uint64
				var err error
				if i%4 < 2 {
					fence, _, _, err = d.drawFence("", fenceKey(key), time.Second)
				} else {
					// The lock's own path: pipelined with a gets.
					fence, _, _, err = d.drawFence(lockKey(key), fenceKey(key), time.Second)
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if fences[fence] {
					t.Errorf("fence %d issued twice", fence)
				}
				fences[fence] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// hookConn runs hook before the first write that starts with prefix.
type hookConn struct {
	net.Conn
	prefix []byte
	hook   *atomic.Pointer[func()]
}

func (c hookConn) Write(b []byte) (int, error) {
	if bytes.HasPrefix(b, c.prefix) {
		if f := c.hook.Swap(nil); f != nil {
			(*f)()
		}
	}
	return c.Conn.Write(b)
}

// hookedDriver returns a driver whose client calls *hook (once) just before
// it sends a command starting with prefix.
func hookedDriver(t *testing.T, prefix string) (*Driver, *atomic.Pointer[func()]) {
	hook := new(atomic.Pointer[func()])
	mc := memcache.New(testenv.MemcacheAddr())
	mc.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var nd net.Dialer
		c, err := nd.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return hookConn{Conn: c, prefix: []byte(prefix), hook: hook}, nil
	}
	t.Cleanup(func() { mc.Close() })
	return mustNew(t, mc), hook
}

// listServer gives d the server list, as Open does, so that it pipelines
// its requests (tryPiped, drawFence).
func listServer(t *testing.T, d *Driver) {
	var sl memcache.ServerList
	if err := sl.SetServers(testenv.MemcacheAddr()); err != nil {
		t.Fatal(err)
	}
	d.servers = &sl
}

// A holder whose lock is lost between its add and its incr would draw a fence
// larger than the next holder's. The confirmation refuses it the grant:
// "client" reads the item with its own gets after the incr, "listed" (a
// driver that knows its server list, as Open makes) in the incr's write.
func TestLostBeforeFenceIsNotGranted(t *testing.T) {
	for _, listed := range []bool{false, true} {
		t.Run(map[bool]string{false: "client", true: "listed"}[listed], func(t *testing.T) { testLostBeforeFence(t, listed) })
	}
}

func testLostBeforeFence(t *testing.T, listed bool) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	a, hook := hookedDriver(t, "incr ")
	if listed {
		listServer(t, a)
	}
	b := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	// The name has a counter, so that A's guess that it is new fails (see
	// tryPiped) and A draws with incr.
	l0 := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
	if _, err := b.TryAcquire(ctx, l0); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, l0); err != nil {
		t.Fatal(err)
	}
	lb := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
	var gb backend.Grant
	var berr error
	f := func() {
		// A's item is evicted, and B takes the lock, before A's incr.
		if err := b.mc.Delete(lockKey(key)); err != nil {
			berr = err
			return
		}
		gb, berr = b.TryAcquire(ctx, lb)
	}
	hook.Store(&f)
	la := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
	ga, err := a.TryAcquire(ctx, la)
	if hook.Load() != nil {
		t.Fatal("A sent no incr")
	}
	if berr != nil {
		t.Fatalf("B: %v", berr)
	}
	if !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("A's TryAcquire = %+v, %v; want ErrNotAcquired: its fence was drawn after B's", ga, err)
	}
	// B is untouched and still holds it.
	if err := b.Refresh(ctx, lb); err != nil {
		t.Fatalf("B's Refresh: %v", err)
	}
	// The next holder after B still gets a larger fence than B, and than
	// the fence A drew and never got.
	if err := b.Release(ctx, lb); err != nil {
		t.Fatal(err)
	}
	lc := backend.Claim{Key: key, Token: token(), TTL: time.Second}
	gc, err := b.TryAcquire(ctx, lc)
	if err != nil {
		t.Fatal(err)
	}
	if gc.Fence <= gb.Fence+1 {
		t.Fatalf("fences: B %d, then C %d; want C > B+1 (A drew B+1)", gb.Fence, gc.Fence)
	}
	b.Release(ctx, lc)
}

// A fence drawn at a release, when another driver has taken the name
// since, is below that holder's: the acquisition that carries it finds the
// counter moved, draws again and records the new fence, above the other
// holder's. So does an acquisition that guessed that a used name was new.
func TestDrawnFenceOvertaken(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	a, b := openDriver(t, testenv.MemcacheAddr()), openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	var last uint64
	for i, d := range []*Driver{a, b, a, a, b} {
		l := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		if g.Fence <= last {
			t.Fatalf("acquisition %d: fence %d after %d", i, g.Fence, last)
		}
		last = g.Fence
		st, err := b.Inspect(ctx, key, backend.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		if st.Fence != g.Fence {
			t.Fatalf("acquisition %d: the item records fence %d, want %d", i, st.Fence, g.Fence)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
}

// An acquisition in one round trip writes its fence in its item before it
// knows it usable (tryPiped): a guess that the name is new, or the fence
// its last release drew, which another driver's holds have overtaken since.
// Inspect never reports such a fence, which nobody is granted: election's
// Observe took a guess, above every later fence, for a term, and then
// ignored the real terms as stale.
func TestInspectHidesUnusableFence(t *testing.T) {
	for _, drawn := range []bool{false, true} {
		t.Run(map[bool]string{false: "guess", true: "drawn"}[drawn], func(t *testing.T) {
			testenv.Require(t, testenv.MemcacheAddr())
			ctx := testCtx(t, 30*time.Second)
			a, hook := hookedDriver(t, "incr ")
			listServer(t, a)
			b := openDriver(t, testenv.MemcacheAddr())
			key := uniqueKey(t, "x")
			cycle := func(d *Driver) {
				l := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
				if _, err := d.TryAcquire(ctx, l); err != nil {
					t.Fatal(err)
				}
				if err := d.Release(ctx, l); err != nil {
					t.Fatal(err)
				}
			}
			if drawn {
				cycle(a) // its release draws its next fence
			}
			cycle(b) // the name has a counter, past A's draw if any
			// Between A's add and the cas that records the fence it draws
			// instead (its incr and that cas follow in two writes).
			var st backend.State
			var serr error
			f := func() { st, serr = b.Inspect(ctx, key, backend.Exclusive) }
			hook.Store(&f)
			l := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
			g, err := a.TryAcquire(ctx, l)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Release(ctx, l)
			if hook.Load() != nil {
				t.Fatal("A drew no fence after its add")
			}
			if serr != nil || !st.Held {
				t.Fatalf("Inspect between A's add and its cas = %+v, %v; want held", st, serr)
			}
			if st.Known.Has(backend.KnowsFence) && st.Fence != g.Fence {
				t.Fatalf("Inspect between A's add and its cas reported fence %d; A was granted %d", st.Fence, g.Fence)
			}
			if st, err := b.Inspect(ctx, key, backend.Exclusive); err != nil || st.Fence != g.Fence {
				t.Fatalf("Inspect after the grant = %+v, %v; want fence %d", st, err, g.Fence)
			}
		})
	}
}

// A fence granted in one round trip reads back at once. Should the counter
// move while the lock is held (the late release of a holder that Break
// removed draws with incr), Inspect stops reporting it until the holder's
// next refresh, Refresh's or RefreshMany's, records it as a plain fence.
func TestPipedFenceSettles(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d, other := openDriver(t, testenv.MemcacheAddr()), openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	piped := func() bool {
		t.Helper()
		it, err := d.mc.Get(lockKey(key))
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := parseValue(it.Value)
		return p
	}
	inspect := func() backend.State {
		t.Helper()
		st, err := other.Inspect(ctx, key, backend.Exclusive)
		if err != nil || !st.Held {
			t.Fatalf("Inspect = %+v, %v; want held", st, err)
		}
		return st
	}
	for i, refresh := range []func(backend.Claim) error{
		func(l backend.Claim) error { return d.Refresh(ctx, l) },
		func(l backend.Claim) error { return d.RefreshMany(ctx, []backend.Claim{l})[0] },
	} {
		// A new name's guess first, then the fence the release drew.
		l := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		if !piped() {
			t.Fatalf("acquisition %d: not granted in one round trip", i)
		}
		if st := inspect(); st.Fence != g.Fence {
			t.Fatalf("acquisition %d: Inspect reports fence %d, want %d", i, st.Fence, g.Fence)
		}
		if _, err := d.mc.Increment(fenceKey(key), 1); err != nil {
			t.Fatal(err)
		}
		if st := inspect(); st.Known.Has(backend.KnowsFence) {
			t.Fatalf("acquisition %d: Inspect reports piped fence %d, which the counter does not show", i, st.Fence)
		}
		if err := refresh(l); err != nil {
			t.Fatal(err)
		}
		if piped() {
			t.Fatalf("acquisition %d: still piped after a refresh", i)
		}
		if st := inspect(); st.Fence != g.Fence {
			t.Fatalf("acquisition %d: after a refresh, Inspect reports fence %d, want %d", i, st.Fence, g.Fence)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
}

// Release races a refresh of the same holder: both complete, token-checked.
func TestReleaseRetriesAfterOwnRefresh(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d, hook := hookedDriver(t, "cas ")
	other := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	l := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	var rerr error
	f := func() { rerr = other.Refresh(ctx, l) } // changes the cas id under the release
	hook.Store(&f)
	if err := d.Release(ctx, l); err != nil {
		t.Fatalf("Release after a concurrent refresh: %v", err)
	}
	if rerr != nil {
		t.Fatalf("Refresh: %v", rerr)
	}
	if _, err := d.mc.Get(lockKey(key)); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("after Release, Get = %v; want a miss", err)
	}
}

// A release whose lock expired and was taken between its gets and its cas
// leaves the new holder's lock alone.
func TestReleaseNeverFreesNextHolder(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d, hook := hookedDriver(t, "cas ")
	other := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	old := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
	if _, err := d.TryAcquire(ctx, old); err != nil {
		t.Fatal(err)
	}
	nu := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
	var nerr error
	f := func() {
		other.mc.Delete(lockKey(key)) // the old lock expires...
		_, nerr = other.TryAcquire(ctx, nu)
	}
	hook.Store(&f)
	if err := d.Release(ctx, old); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release of a lock taken over meanwhile = %v, want ErrNotHeld", err)
	}
	if nerr != nil {
		t.Fatalf("new holder: %v", nerr)
	}
	if err := other.Refresh(ctx, nu); err != nil {
		t.Fatalf("new holder's lock was touched: %v", err)
	}
	other.Release(ctx, nu)
}

func TestNewLeavesUserClientOpen(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	mc := memcache.New(testenv.MemcacheAddr())
	defer mc.Close()
	c, err := locker.New(mustNew(t, mc), locker.WithNamespace("mctest-"+randHex(4)))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	_ = l
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := mc.Ping(); err != nil {
		t.Fatalf("the user's client after Close: %v", err)
	}
	if err := c.Driver().Close(); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("second driver Close = %v, want ErrClosed", err)
	}
	if _, err := c.Driver().TryAcquire(ctx, backend.Claim{Key: "a/b", Token: token(), TTL: time.Second}); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("TryAcquire on a closed driver = %v, want ErrClosed", err)
	}
}

// With several servers, gomemcache's hashing spreads the locks, and two
// processes with the same server list agree on each lock's server.
func TestSeveralServers(t *testing.T) {
	a1, a2 := testenv.MemcacheAddr(), testenv.MemcacheSmallAddr()
	testenv.Require(t, a1, a2)
	ctx := testCtx(t, 30*time.Second)
	ns := "mctest-" + randHex(4)
	c1 := openClient(t, a1+","+a2, locker.WithNamespace(ns))
	c2 := openClient(t, a1+","+a2, locker.WithNamespace(ns))
	s1, s2 := memcache.New(a1), memcache.New(a2)
	defer s1.Close()
	defer s2.Close()
	var on1, on2 int
	for i := range 20 {
		name := fmt.Sprintf("lock-%d", i)
		l, err := c1.TryAcquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c2.TryAcquire(ctx, name); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("second client's TryAcquire(%q) = %v, want ErrNotAcquired", name, err)
		}
		k := lockKey(backend.Key(ns, name))
		_, e1 := s1.Get(k)
		_, e2 := s2.Get(k)
		switch {
		case e1 == nil && errors.Is(e2, memcache.ErrCacheMiss):
			on1++
		case e2 == nil && errors.Is(e1, memcache.ErrCacheMiss):
			on2++
		default:
			t.Fatalf("lock %q: server 1 says %v, server 2 says %v", name, e1, e2)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if on1 == 0 || on2 == 0 {
		t.Fatalf("20 locks: %d on the first server, %d on the second; want both used", on1, on2)
	}
}

// A holder whose item records no fence (its acquisition has not confirmed
// yet, or an older version wrote it) is reported held without one, and
// Break, which needs the fence, leaves it alone.
func TestInspectWithoutFence(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	mc := memcache.New(testenv.MemcacheAddr())
	defer mc.Close()
	d := mustNew(t, mc)
	ctx := context.Background()
	for _, v := range [][]byte{holdValue(token(), "job 7"), []byte(token() + " job 7")} {
		key := uniqueKey(t, "nofence")
		if err := mc.Set(&memcache.Item{Key: lockKey(key), Value: v, Expiration: 60}); err != nil {
			t.Fatal(err)
		}
		st, err := d.Inspect(ctx, key, backend.Exclusive)
		if err != nil || !st.Held || st.Owner != "job 7" || st.Known.Has(backend.KnowsFence) || st.Known.Has(backend.KnowsTTL) {
			t.Fatalf("Inspect of %q = %+v, %v; want held by job 7, no fence, no TTL", v, st, err)
		}
		// The Client names the operation: the driver says only what it found.
		if _, err := d.Break(ctx, key, backend.Exclusive, 0); !errors.Is(err, backend.ErrNotHeld) || err.Error() != "memcachelock: not held" {
			t.Fatalf("Break of %q under fence 0 = %v, want ErrNotHeld", v, err)
		}
		if it, err := mc.Get(lockKey(key)); err != nil || string(it.Value) != string(v) {
			t.Fatalf("the item after Break: %v, %v", it, err)
		}
	}
}
