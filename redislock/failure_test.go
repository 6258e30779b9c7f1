package redislock

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/internal/testenv"
)

// A restart without persistence forgets every lock: the holder's lost signal
// fires within one TTL, a blocked waiter gets the lock (no one is left
// blocked), and its fence is still greater than the lost holder's although
// the counter was forgotten too.
//
// It restarts the instance redis-restart, which no other test uses: go test
// runs packages in parallel, and a restart would break their locks too.
func TestRestartWithoutPersistence(t *testing.T) {
	testenv.Require(t, testenv.RedisRestartAddr())
	ctx := testCtx(t)
	const ttl = 3 * time.Second
	open := func() *locker.Client {
		d, err := Open(ctx, "redis://"+testenv.RedisRestartAddr()+"/0?max_retries=-1", withTTLRestartDelay())
		if err != nil {
			t.Fatal(err)
		}
		c, err := locker.New(d, locker.WithNamespace("redislock-restart"), locker.WithDefaultTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	holder, waiter := open(), open()
	name := "restart-" + randHex(4)
	l, err := holder.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *locker.Lock
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		w, err := waiter.Acquire(ctx, name)
		got <- result{w, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	// When the signal fires, whenever this goroutine looks: a restart
	// slower than the TTL must not turn the check below into a coin
	// toss between two ready cases.
	lostAt := make(chan time.Time, 1)
	go func() {
		<-l.Lost()
		lostAt <- time.Now()
	}()

	stopped := time.Now()
	testenv.Stop(t, "redis-restart")
	testenv.Start(t, "redis-restart")
	restarted := time.Now()
	t.Logf("redis stopped and started again in %v", restarted.Sub(stopped).Round(time.Millisecond))

	select {
	case at := <-lostAt:
		t.Logf("lost signal %v after the stop: %v", at.Sub(stopped).Round(time.Millisecond), l.Err())
		if !errors.Is(l.Err(), locker.ErrLost) {
			t.Fatalf("Err() = %v, want ErrLost", l.Err())
		}
		if late := at.Sub(stopped); late > ttl+time.Second {
			t.Fatalf("lost signal %v after the stop, not within one TTL (%v)", late, ttl)
		}
	case <-time.After(ttl + 5*time.Second): // the bound is checked above; this one only ends the wait
		t.Fatalf("no lost signal %v after the stop (TTL %v)", time.Since(stopped), ttl)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		t.Logf("waiter acquired %v after the restart", r.at.Sub(restarted).Round(time.Millisecond))
		if r.l.Fence() <= l.Fence() {
			t.Fatalf("fence %d after the restart, %d before: fences went back", r.l.Fence(), l.Fence())
		}
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(ttl + 5*time.Second):
		t.Fatalf("the waiter is still blocked %v after the restart", time.Since(restarted))
	}
	if err := l.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("the lost holder's Release = %v, want ErrNotHeld", err)
	}
}

// proxy forwards TCP connections to a server until cut, when it drops every
// connection and refuses new ones (by closing them at once) until restored.
type proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration // holds back what the client sends by this much
	slowN  int           // on the first slowN connections only (0: all)
	n      int           // connections accepted

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy { return newDelayProxy(t, target, 0) }

func newDelayProxy(t *testing.T, target string, delay time.Duration) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.n++
		delay := p.delay
		if p.slowN > 0 && p.n > p.slowN {
			delay = 0
		}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); forward(s, c, delay); s.Close(); c.Close() }()
		go func() { defer p.wg.Done(); io.Copy(c, s); s.Close(); c.Close() }()
	}
}

// forward copies from src to dst, each chunk delay late.
func forward(dst, src net.Conn, delay time.Duration) {
	if delay == 0 {
		io.Copy(dst, src)
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			time.Sleep(delay)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]struct{}{}
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.setCut(true)
	p.wg.Wait()
}

// A connection loss shorter than the TTL does not lose the lock: refreshes
// fail while it lasts, then succeed, and nobody else gets the lock.
func TestConnectionLossWithinTTL(t *testing.T) {
	testenv.Require(t, testenv.RedisAddr())
	t.Parallel()
	ctx := testCtx(t)
	const ttl = 3 * time.Second
	p := newProxy(t, testenv.RedisAddr())
	d, err := Open(ctx, "redis://"+p.addr()+"/0?dial_timeout=500ms&read_timeout=500ms&write_timeout=500ms")
	if err != nil {
		t.Fatal(err)
	}
	c, err := locker.New(d, locker.WithNamespace("redislock-netloss"), locker.WithDefaultTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other := openDriver(t)
	oc, err := locker.New(other, locker.WithNamespace("redislock-netloss"))
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()

	name := "netloss-" + randHex(4)
	l, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter on the other side, through the outage.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	waited := make(chan error, 1)
	go func() {
		w, err := oc.Acquire(wctx, name)
		if err == nil {
			w.Release(ctx)
			err = errors.New("the waiter got the lock while it was held")
		}
		waited <- err
	}()

	p.setCut(true)
	// Past the first refresh (TTL/3) and well into the second.
	time.Sleep(ttl * 55 / 100)
	if err := l.Refresh(ctx); err == nil {
		t.Fatalf("Refresh succeeded through a cut connection")
	} else if errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Refresh during the outage = %v: an outage must not count as a loss", err)
	}
	p.setCut(false)
	deadline := time.Now().Add(ttl)
	for {
		err := l.Refresh(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Refresh after the connection came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Two more TTLs: the watchdog keeps it.
	time.Sleep(2 * ttl)
	notLostYet(t, l)
	wcancel()
	if err := <-waited; !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("waiter: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after the outage: %v", err)
	}
}

func notLostYet(t *testing.T, l *locker.Lock) {
	t.Helper()
	select {
	case <-l.Lost():
		t.Fatalf("the lock was lost: %v", l.Err())
	default:
	}
}
