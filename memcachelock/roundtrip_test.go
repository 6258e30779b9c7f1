package memcachelock

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// countConn counts the requests written on a connection (gomemcache and
// the probes write each request at once, in one write).
type countConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// countedDriver is a driver with a server list, as Open makes one (so that
// the restart check runs), whose connections count their requests and
// dials.
func countedDriver(t *testing.T) (d *Driver, writes, dials *atomic.Int64) {
	writes, dials = new(atomic.Int64), new(atomic.Int64)
	var sl memcache.ServerList
	if err := sl.SetServers(testenv.MemcacheAddr()); err != nil {
		t.Fatal(err)
	}
	mc := memcache.NewFromSelector(&sl)
	mc.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var nd net.Dialer
		c, err := nd.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		dials.Add(1)
		return countConn{Conn: c, writes: writes}, nil
	}
	t.Cleanup(func() { mc.Close() })
	d = mustNew(t, mc)
	d.servers = &sl
	t.Cleanup(func() { d.Close() })
	return d, writes, dials
}

// A driver made by New cannot see its client's server list: no pipelined
// requests, so a cycle costs six round trips (add, incr, gets, cas; gets,
// cas), on a new name or not.
func TestRoundTripsNew(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d, writes, _ := countedDriver(t)
	d.servers = nil
	key := uniqueKey(t, "x")
	for i := range 3 {
		w0 := writes.Load()
		l := backend.Claim{Key: key, Token: token(), TTL: time.Second}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		want := int64(6)
		if i == 0 {
			want = 7 // the seed's add after the incr found no counter
		}
		if n := writes.Load() - w0; n != want {
			t.Errorf("cycle %d: %d round trips, want %d", i, n, want)
		}
	}
}

// The round trips of an uncontended acquire+release: two, as the raw
// floor's add and delete, on a new name (the add carries a seed, whose add
// of the counter goes in the same write, with a gets of both) and on a
// name this driver released last (the add carries the fence drawn by the
// release's incr, which went with its cas). A name whose counter another
// driver moved since costs four: that write, incr with gets, cas with
// gets, the release. No dial, no stats per name: the first cycle dials
// one probe connection, which reads the server's uptime once.
func TestRoundTrips(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d, writes, dials := countedDriver(t)
	other := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	cycle := func(d *Driver, k string) {
		t.Helper()
		l := backend.Claim{Key: k, Token: token(), TTL: time.Second}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	cycle(d, key+"-warm") // dials a probe, which reads the uptime
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials for the first cycle, want 1 (the probe)", n)
	}
	for i, c := range []struct {
		key   string
		moved bool // another driver takes the name first
		want  int64
	}{{key + "-new", false, 2}, {key + "-new", false, 2}, {key + "-new", true, 4}, {key + "-new", false, 2}, {key + "-other", true, 4}} {
		if c.moved {
			cycle(other, c.key)
		}
		w0, d0 := writes.Load(), dials.Load()
		cycle(d, c.key)
		if n := writes.Load() - w0; n != c.want {
			t.Errorf("cycle %d: %d round trips, want %d", i, n, c.want)
		}
		if n := dials.Load() - d0; n != 0 {
			t.Errorf("cycle %d: %d dials, want none", i, n)
		}
	}
}

// A probe connection that broke while idle (as a server restart breaks
// it: the server's end closes) is replaced by a new one, which reads the
// uptime again. The driver's connections go through a proxy that can cut
// each one on the server's side.
func TestProbeReplaced(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var sides []net.Conn // the proxy's end of each connection, in dial order
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", testenv.MemcacheAddr())
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			sides = append(sides, c)
			mu.Unlock()
			go func() { io.Copy(s, c); s.Close() }()
			go func() { io.Copy(c, s); c.Close() }()
		}
	}()
	var sl memcache.ServerList
	if err := sl.SetServers(ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	mc := memcache.NewFromSelector(&sl)
	t.Cleanup(func() { mc.Close() })
	d := mustNew(t, mc)
	d.servers = &sl
	t.Cleanup(func() { d.Close() })
	conns := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(sides)
	}
	key := uniqueKey(t, "x")
	for i := range 2 {
		l := backend.Claim{Key: key + string(rune('a'+i)), Token: token(), TTL: time.Second}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			break
		}
		if n := conns(); n != 1 {
			t.Fatalf("%d connections after the first cycle, want 1 (the probe)", n)
		}
		mu.Lock()
		sides[0].Close()
		mu.Unlock()
	}
	if n := conns(); n != 2 {
		t.Errorf("%d connections, want 2 (the probe, its replacement)", n)
	}
}

// Release's single cas on the cas id its acquisition read fails when the
// item changed since, and Release then takes the long way: after a
// refresh, after a waiter's mark (which it still reads: it yields to that
// waiter's driver), and after the item was lost and taken by another
// holder (whose lock it leaves alone).
func TestReleaseAfterChange(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	other := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	acquire := func(d *Driver) backend.Claim {
		t.Helper()
		l := backend.Claim{Key: key, Token: token(), TTL: 5 * time.Second}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	free := func() {
		t.Helper()
		if _, err := other.mc.Get(lockKey(key)); !errors.Is(err, memcache.ErrCacheMiss) {
			t.Fatalf("the lock's item after the release: %v, want none", err)
		}
	}

	l := acquire(d)
	if _, ok := d.held.m[heldKey{l.Key, l.Token}]; !ok {
		t.Fatal("the acquisition kept no item for Release")
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatalf("Release (one cas): %v", err)
	}
	free()

	l = acquire(d)
	if err := d.Refresh(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatalf("Release after a refresh: %v", err)
	}
	free()

	l = acquire(d)
	waiter := token()
	if err := other.mc.Append(&memcache.Item{Key: lockKey(key), Value: []byte(markSep + waiter)}); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatalf("Release after a mark: %v", err)
	}
	free()
	d.waits.mu.Lock()
	kw := d.waits.keys[key]
	yielding := kw != nil && time.Now().Before(kw.yieldEnd)
	d.waits.mu.Unlock()
	if !yielding {
		t.Error("the release did not read the waiter's mark: it should yield to it")
	}

	// A new key: d now leaves the first one to the marked waiter.
	key += "-2"
	l = acquire(d)
	if err := other.mc.Delete(lockKey(key)); err != nil { // as an eviction would
		t.Fatal(err)
	}
	lo := acquire(other)
	if err := d.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Release of a lost lock = %v, want ErrNotHeld", err)
	}
	if err := other.Refresh(ctx, lo); err != nil {
		t.Fatalf("the next holder's lock after the stale release: %v", err)
	}
	if err := other.Release(ctx, lo); err != nil {
		t.Fatal(err)
	}
}

// With every probe connection in use, an acquisition takes gomemcache's
// path (incr, then gets and cas) rather than dial another: it still gets
// a larger fence, and its release the long way.
func TestProbesBusy(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	d := openDriver(t, testenv.MemcacheAddr())
	key := uniqueKey(t, "x")
	var last uint64
	for i := range 3 {
		if i == 1 {
			addr, err := d.servers.PickServer(lockKey(key))
			if err != nil {
				t.Fatal(err)
			}
			d.probes.mu.Lock()
			for _, p := range d.probes.idle[addr.String()] {
				p.Close()
			}
			d.probes.idle = nil
			d.probes.open[addr.String()] = d.maxIdle() // as if all were in use
			d.probes.mu.Unlock()
		}
		l := backend.Claim{Key: key, Token: token(), TTL: time.Second}
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		if g.Fence <= last {
			t.Fatalf("fence %d after %d", g.Fence, last)
		}
		last = g.Fence
		d.held.mu.Lock()
		_, kept := d.held.m[heldKey{l.Key, l.Token}]
		d.held.mu.Unlock()
		if kept != (i == 0) {
			t.Errorf("acquisition %d: kept its item for Release: %v, want %v", i, kept, i == 0)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
}

// A driver whose restart check is shorter than the TTL (WithRestartDelay)
// keeps no cas id for Release: after a restart, another holder's item
// could carry it (see heldItems).
func TestNoHeldItemWithShortRestartDelay(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	ctx := testCtx(t, 30*time.Second)
	for _, c := range []struct {
		delay time.Duration
		kept  bool
	}{{0, false}, {time.Second, false}, {time.Minute, true}} {
		d, err := Open(ctx, "memcache://"+testenv.MemcacheAddr(), WithRestartDelay(c.delay))
		if err != nil {
			t.Fatal(err)
		}
		l := backend.Claim{Key: uniqueKey(t, "x"), Token: token(), TTL: 5 * time.Second}
		if _, err := d.TryAcquire(ctx, l); err != nil {
			t.Fatal(err)
		}
		d.held.mu.Lock()
		_, kept := d.held.m[heldKey{l.Key, l.Token}]
		d.held.mu.Unlock()
		if kept != c.kept {
			t.Errorf("restart delay %v, TTL %v: kept a cas id: %v, want %v", c.delay, l.TTL, kept, c.kept)
		}
		if err := d.Release(ctx, l); err != nil {
			t.Error(err)
		}
		d.Close()
	}
}
