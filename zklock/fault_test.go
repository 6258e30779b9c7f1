package zklock

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// TestWatchEventIsNoContact: partitioned from the server in the
// client-to-server direction just before a watch event reaches it, a
// holder is told its lock is lost by the deadline its last answered
// request sets, before another client gets the lock. The server expires
// the session one timeout after it last heard from the holder; the event
// it sent since proves nothing about that.
func TestWatchEventIsNoContact(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	p := newProxy(t, servers[0])
	holder := dial(t, []string{p.addr()})
	other, next := dial(t, servers), dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	lockA, lockB := lockFor(t, uniqueKey(t)), lockFor(t, uniqueKey(t))
	lostAt := make(chan time.Time, 1)
	lockA.OnLost = func(error) { lostAt <- time.Now() }
	if _, err := holder.TryAcquire(ctx, lockA); err != nil {
		t.Fatal(err)
	}
	// The holder waits for B, held by other: it watches other's node.
	if _, err := other.TryAcquire(ctx, lockB); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	waited := make(chan error, 1)
	go func() {
		_, err := acquire(wctx, holder, lockFor(t, lockB.Key))
		waited <- err
	}()
	for entries(t, other, lockB.Key) != 2 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // the watch is set
	gotAt := make(chan time.Time, 1)
	go func() {
		if _, err := acquire(ctx, next, lockFor(t, lockA.Key)); err != nil {
			t.Error(err)
		}
		gotAt <- time.Now()
	}()

	p.blackhole(true, false)
	cutAt := time.Now() // every answered request was sent before this
	time.Sleep(testTimeout / 4)
	if err := other.Release(ctx, lockB); err != nil { // the watch event
		t.Fatal(err)
	}
	var lost, got time.Time
	select {
	case lost = <-lostAt:
	case <-time.After(3 * testTimeout):
		t.Fatal("no lost signal")
	}
	select {
	case got = <-gotAt:
	case <-time.After(3 * testTimeout):
		t.Fatal("the next client never got the lock")
	}
	t.Logf("cut off at 0, watch event at %v, lost signal at %v, the next client got the lock at %v (session timeout %v)",
		testTimeout/4, lost.Sub(cutAt), got.Sub(cutAt), testTimeout)
	// The deadline is contact + timeout - margin, and the contact was
	// before the cut; 250 ms is for timer and scheduling slack.
	if limit := testTimeout - backend.ClockMargin(testTimeout) + 250*time.Millisecond; lost.Sub(cutAt) > limit {
		t.Errorf("lost signal %v after the cut, want at most %v: the watch event counted as contact", lost.Sub(cutAt), limit)
	}
	if !lost.Before(got) {
		t.Errorf("two holders: the next client got the lock %v before the holder was told", lost.Sub(got))
	}
	wcancel()
	select {
	case <-waited:
	case <-time.After(time.Second):
		t.Error("the holder's waiter did not return after its context ended")
	}
}

// TestWaiterCancelCutOff: a waiter cut off from the server returns within
// 100 ms and a round trip of its context's end, whether it was waiting
// for its turn or still creating its queue node, and once the connection
// is back its node is gone. The Client waits: the driver's Enqueue, Wait
// and Leave keep to that.
func TestWaiterCancelCutOff(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	for _, stage := range []string{"waiting", "creating"} {
		t.Run(stage, func(t *testing.T) {
			p := newProxy(t, servers[0])
			waiter := dial(t, []string{p.addr()})
			c := clientOf(t, waiter)
			holder := dial(t, servers)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			key := uniqueKey(t)
			if _, err := holder.TryAcquire(ctx, lockFor(t, key)); err != nil {
				t.Fatal(err)
			}
			rttStart := time.Now()
			if _, _, err := waiter.conn.Exists("/"); err != nil {
				t.Fatal(err)
			}
			rtt := time.Since(rttStart)
			sid := waiter.conn.SessionID()

			wctx, wcancel := context.WithCancel(ctx)
			defer wcancel()
			done := make(chan error, 1)
			if stage == "creating" {
				p.blackhole(true, true)
			}
			go func() {
				_, err := c.Acquire(wctx, nameOf(key))
				done <- err
			}()
			if stage == "waiting" {
				for entries(t, holder, key) != 2 {
					time.Sleep(10 * time.Millisecond)
				}
				time.Sleep(200 * time.Millisecond) // the watch is set
				p.blackhole(true, true)
			} else {
				time.Sleep(200 * time.Millisecond) // the create is on its way
			}
			wcancel()
			cancelled := time.Now()
			// 100 ms and a round trip, plus 150 ms for scheduling slack.
			limit := 100*time.Millisecond + rtt + 150*time.Millisecond
			select {
			case err := <-done:
				took := time.Since(cancelled)
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Acquire = %v, want context.Canceled", err)
				}
				t.Logf("Acquire returned %v after the cancel (round trip %v)", took, rtt)
				if took > limit {
					t.Errorf("Acquire returned %v after the cancel, want at most %v", took, limit)
				}
			case <-time.After(3 * testTimeout):
				t.Fatal("Acquire did not return after the cancel")
			}
			// The connection comes back: the zk client resumes the session
			// on a new connection, and the node goes.
			p.blackhole(false, false)
			p.cut()
			deadline := time.Now().Add(2 * testTimeout)
			for entries(t, holder, key) != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("%d nodes in the queue %v after the connection came back, want the holder's only", entries(t, holder, key), 2*testTimeout)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("session lived on: %v", waiter.conn.SessionID() == sid)
		})
	}
}

// TestWatchSetOnNewSession: the waiter's session expires between its
// listing of the queue and its watch on its predecessor, and the zk client
// sends the watch on its new session. The waiter must report the expiry,
// not wait for a predecessor that never goes (the CI flake of
// TestWaiterSessionExpires, made certain): it queues again on its new
// session and takes the lock when it is released.
func TestWatchSetOnNewSession(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	holder, waiter := dial(t, servers), dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := uniqueKey(t)
	hl := lockFor(t, key)
	if _, err := holder.TryAcquire(ctx, hl); err != nil {
		t.Fatal(err)
	}
	first := waiter.conn.SessionID()
	_, g := drivers.bySession(first)
	hooked := make(chan error, 1)
	waiter.testHookWatch = func() {
		waiter.testHookWatch = nil // the waiter's goroutine only
		sid := waiter.conn.SessionID()
		_, passwd := drivers.credentials(waiter)
		g.close() // the waiter reconnects only once the hook returns
		err := expireSession(servers, sid, passwd)
		for deadline := time.Now().Add(5 * time.Second); err == nil && waiter.conn.State() == zk.StateHasSession; {
			if time.Now().After(deadline) {
				err = errors.New("the waiter's connection stayed up")
			}
			time.Sleep(5 * time.Millisecond)
		}
		go func() {
			time.Sleep(100 * time.Millisecond) // the watch request is queued
			g.open()
		}()
		hooked <- err
	}
	done := make(chan error, 1)
	c := clientOf(t, waiter) // it queues again
	go func() {
		_, err := c.Acquire(ctx, nameOf(key))
		done <- err
	}()
	if err := <-hooked; err != nil {
		g.open()
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * testTimeout); ; {
		select {
		case err := <-done:
			t.Fatalf("Acquire = %v after its session expired, want it to queue again", err)
		default:
		}
		if now := waiter.conn.SessionID(); now != first && now != 0 && waitersOf(t, holder, key, now) == 1 && entries(t, holder, key) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter has not queued again on its new session: it watches its predecessor on a new session")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := holder.Release(ctx, hl); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Acquire = %v, want the lock", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not take the released lock")
	}
}

// zkGoroutines counts the goroutines of the zk client and of the driver,
// leaving out the tests' own.
func zkGoroutines() (int, string) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	var found []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "testing.tRunner") || strings.Contains(g, "zklock.(*proxy)") {
			continue
		}
		if strings.Contains(g, "github.com/go-zookeeper/zk.") || strings.Contains(g, "locker/zklock.(*") {
			n++
			found = append(found, g)
		}
	}
	return n, strings.Join(found, "\n\n")
}

// TestCloseCutOff: Close of a driver cut off from the server returns
// within 2 s, whether its connection is up but silent or it is
// reconnecting into silence, and leaves no goroutine of its own or of the
// zk client behind. Not parallel: it counts goroutines.
func TestCloseCutOff(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	for _, state := range []string{"connected", "reconnecting"} {
		t.Run(state, func(t *testing.T) {
			holder := dial(t, servers)
			// The holder's zk client starts its send and receive loops after
			// its session is set: count once a request was answered and the
			// count has settled (the previous subtest's clients may still be
			// ending), not at once.
			if _, _, err := holder.conn.Exists("/"); err != nil {
				t.Fatal(err)
			}
			before := settledGoroutines(t, -1)
			p := newProxy(t, servers[0])
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			d, err := dialDriver(ctx, []string{p.addr()}, WithSessionTimeout(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			key := uniqueKey(t)
			if _, err := holder.TryAcquire(ctx, lockFor(t, key)); err != nil {
				t.Fatal(err)
			}
			if _, err := d.TryAcquire(ctx, lockFor(t, uniqueKey(t))); err != nil {
				t.Fatal(err)
			}
			waited := make(chan error, 1)
			c := clientOf(t, d) // it rides out the cut until Close
			go func() {
				_, err := c.Acquire(ctx, nameOf(key))
				waited <- err
			}()
			for entries(t, holder, key) != 2 {
				time.Sleep(10 * time.Millisecond)
			}
			p.blackhole(true, true)
			if state == "reconnecting" {
				p.cut()
				for deadline := time.Now().Add(5 * time.Second); d.conn.State() == zk.StateHasSession; {
					if time.Now().After(deadline) {
						t.Fatal("the driver did not notice the cut")
					}
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(200 * time.Millisecond) // the new connection waits for its answer
			}
			start := time.Now()
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			t.Logf("Close took %v", took)
			if took > closeLimit {
				t.Errorf("Close took %v, want at most %v", took, closeLimit)
			}
			select {
			case err := <-waited:
				if !errors.Is(err, backend.ErrClosed) {
					t.Errorf("Acquire during Close = %v, want ErrClosed", err)
				}
			case <-time.After(time.Second):
				t.Error("Acquire did not return after Close")
			}
			// Goroutines that have done their last step may take a moment
			// to end, longer on a loaded machine (up to 10s).
			if n := settledGoroutines(t, before); n > before {
				_, stacks := zkGoroutines()
				t.Errorf("%d goroutines of the driver or the zk client after Close, %d before:\n%s", n, before, stacks)
			}
		})
	}
}

// TestLostNodeFreedWhenSessionLives: a holder that hears no answer for a
// session timeout is told its lock is lost, but the server may keep the
// session (here: it hears the holder's pings and its reconnection, the
// answers are dropped; in the fault suite: a paused server that, resumed,
// revalidates the reconnection before it expires the session). The node
// of the lost lock must go once the connection is back, or the waiter
// behind it waits for as long as the session lives.
func TestLostNodeFreedWhenSessionLives(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	p := newProxy(t, servers[0])
	holder := dial(t, []string{p.addr()})
	waiter := dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	l := lockFor(t, uniqueKey(t))
	lostAt := make(chan time.Time, 1)
	l.OnLost = func(error) { lostAt <- time.Now() }
	if _, err := holder.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	sid := holder.conn.SessionID()
	type result struct {
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		_, err := acquire(ctx, waiter, lockFor(t, l.Key))
		got <- result{err, time.Now()}
	}()
	for entries(t, waiter, l.Key) != 2 {
		time.Sleep(10 * time.Millisecond)
	}

	// Answers are dropped; the server still hears the holder's pings and,
	// once the zk client gives up on the silent connection (two thirds of
	// the timeout), its reconnection: the session lives on the server at
	// least a timeout past that.
	p.blackhole(false, true)
	cutAt := time.Now()
	var lost time.Time
	select {
	case lost = <-lostAt:
	case <-time.After(3 * testTimeout):
		t.Fatal("no lost signal")
	}
	// Heal at once, and cut the connection whose handshake answer was
	// dropped: the zk client reconnects and resumes its session.
	p.blackhole(false, false)
	p.cut()
	healed := time.Now()
	t.Logf("answers dropped at 0, lost signal at %v, healed at %v", lost.Sub(cutAt), healed.Sub(cutAt))
	var r result
	select {
	case r = <-got:
	case <-time.After(2 * testTimeout):
		t.Fatalf("the waiter still waits %v after the holder, told its lock was lost, reconnected (holder's session %#x, now %#x)",
			2*testTimeout, sid, holder.conn.SessionID())
	}
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if now := holder.conn.SessionID(); now != sid {
		// Not the case under test: the session expired, and its node with it.
		t.Fatalf("the holder's session %#x expired (now %#x): the test did not keep it alive", sid, now)
	}
	t.Logf("the waiter got the lock %v after the heal", r.at.Sub(healed))
	if !lost.Before(r.at) {
		t.Errorf("two holders: the waiter got the lock %v before the holder was told", lost.Sub(r.at))
	}
	if err := holder.Release(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Release of the lost lock: %v, want ErrNotHeld", err)
	}
}
