package zklock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// markers counts the delay markers of key's lock.
func markers(t *testing.T, d *Driver, key string) int {
	t.Helper()
	return len(slices.DeleteFunc(children(t, d, d.parentPath(key)), func(n string) bool {
		_, ok := markerHash(n)
		return !ok
	}))
}

// A delay costs no request: an acquire+release with one sends one
// multi-op each way (the marker made and deleted with the node), on a new
// name and on a known one, and leaves nothing; nor does a Close.
func TestDelayRequests(t *testing.T) {
	t.Parallel()
	var o opCounter
	d := dial(t, testenv.ZKAddrs(), WithDialer(o.dialer))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := uniqueKey(t)
	for i := range 3 {
		l := lockFor(t, key)
		l.Delay = time.Hour
		before := o.snapshot()
		if _, err := acquire(ctx, d, l); err != nil {
			t.Fatal(err)
		}
		mid := o.snapshot()
		if n := markers(t, d, key); n != 1 {
			t.Fatalf("cycle %d: %d markers while held, want 1", i, n)
		}
		held := o.snapshot()
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		after := o.snapshot()
		// Not reads of the node (the held node's watch, a grant's check
		// after a quiet spell), which a claim without a delay sends too.
		for _, op := range []int32{opCreate, opDelete, opSetData, opGetChildren, opGetChildren2} {
			if n := mid[op] - before[op] + after[op] - held[op]; n != 0 {
				t.Errorf("cycle %d: acquire+release sent %d requests of op %d, want none but multi-ops", i, n, op)
			}
		}
		if a, r := mid[opMulti]-before[opMulti], after[opMulti]-held[opMulti]; a != 1 || r != 1 {
			t.Errorf("cycle %d: acquire sent %d multi-ops, release %d; want 1 and 1", i, a, r)
		}
		if n := markers(t, d, key); n != 0 {
			t.Fatalf("cycle %d: %d markers after the release, want none", i, n)
		}
	}
	// Close releases too, delay or not.
	closing := dial(t, testenv.ZKAddrs())
	l := lockFor(t, key)
	l.Delay = time.Hour
	if _, err := closing.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := closing.Close(); err != nil {
		t.Fatal(err)
	}
	if n := markers(t, d, key); n != 0 {
		t.Fatalf("%d markers after Close, want none", n)
	}
}

// A name in its delay shows as held by the lost holder (its owner and
// fence), refuses claims, and Break ends the delay: a waiter gets the
// name at once, and nothing of the lost lock is left.
func TestDelayInspectAndBreak(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	holder, other, waiter := dial(t, servers), dial(t, servers), dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := uniqueKey(t)
	l := lockFor(t, key)
	l.Delay, l.Owner = time.Hour, "lost-holder"
	g, err := holder.TryAcquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	if err := expireKey(ctx, servers, other, key); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, lockFor(t, key)); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire in the delay: %v, want ErrNotAcquired", err)
	}
	st, err := other.Inspect(ctx, key, backend.Exclusive)
	if err != nil || !st.Held || st.Owner != "lost-holder" || st.Fence != g.Fence {
		t.Fatalf("Inspect in the delay = %+v, %v; want held by lost-holder, fence %d", st, err, g.Fence)
	}
	got := make(chan error, 1)
	go func() {
		_, err := acquire(ctx, waiter, lockFor(t, key))
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a waiter got the name in its delay: %v", err)
	case <-time.After(time.Second):
	}
	if st, err := other.Inspect(ctx, key, backend.Exclusive); err != nil || st.Owner != "lost-holder" || st.Waiters != 1 {
		t.Fatalf("Inspect in the delay, with a waiter = %+v, %v; want held by lost-holder, 1 waiter", st, err)
	}
	if _, err := other.Break(ctx, key, backend.Exclusive, g.Fence+1); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Break under another fence: %v, want ErrNotHeld", err)
	}
	broke := time.Now()
	if st, err := other.Break(ctx, key, backend.Exclusive, g.Fence); err != nil || st.Owner != "lost-holder" || st.Waiters != 1 {
		t.Fatalf("Break in the delay = %+v, %v", st, err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the waiter did not get the name within 2s of the Break")
	}
	t.Logf("the waiter got the name %v after the Break", time.Since(broke).Round(time.Millisecond))
	if n := markers(t, other, key); n != 0 {
		t.Fatalf("%d markers left after the Break", n)
	}
}

// delayChildEnv tells a child process of this test binary to take a lock
// with a delay: "kill KEY DELAY" holds it until killed, "release KEY
// DELAY" releases it and exits.
const delayChildEnv = "ZKLOCK_DELAY_CHILD"

// TestDelayAfterKill: a holder killed with -9 keeps the name from a
// waiter until the delay after its session's end (seen as its node's
// deletion), and no longer than the session timeout and the delay after
// the kill, with some slack; a holder that releases and exits leaves no
// delay.
func TestDelayAfterKill(t *testing.T) {
	t.Parallel()
	const delay = 3 * time.Second
	servers := testenv.ZKAddrs()
	d := dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	key := uniqueKey(t)

	child, path := startDelayChild(t, ctx, "kill", key, delay)
	ok, _, gone, err := d.conn.ExistsW(path)
	if err != nil || !ok {
		t.Fatalf("the child's node %s: %v, %v", path, ok, err)
	}
	got := make(chan time.Time, 1)
	l := lockFor(t, key)
	go func() {
		if _, err := acquire(ctx, d, l); err != nil {
			t.Error(err)
		}
		got <- time.Now()
	}()
	for deadline := time.Now().Add(5 * time.Second); len(children(t, d, d.parentPath(key))) < 3; { // the child's node and marker, ours
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
		time.Sleep(10 * time.Millisecond)
	}
	killed := time.Now()
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	var ended, granted time.Time
	select {
	case <-gone:
		ended = time.Now()
	case <-ctx.Done():
		t.Fatal("the killed holder's node never went")
	}
	select {
	case granted = <-got:
	case <-ctx.Done():
		t.Fatal("the waiter never got the name")
	}
	t.Logf("kill -9 at 0: session ended at %v, the waiter got the name at %v (session timeout %v, delay %v)",
		ended.Sub(killed).Round(time.Millisecond), granted.Sub(killed).Round(time.Millisecond), d.SessionTTL(), delay)
	if early := ended.Add(delay).Sub(granted); early > 0 {
		t.Errorf("the name was granted %v before the delay after the session's end", early)
	}
	if bound := d.SessionTTL() + delay + 1500*time.Millisecond; granted.Sub(killed) > bound {
		t.Errorf("the name was granted %v after the kill, want within %v", granted.Sub(killed), bound)
	}
	if err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}

	// A clean release: no delay, and no marker left.
	startDelayChild(t, ctx, "release", key, time.Hour)
	l = lockFor(t, key)
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatalf("TryAcquire after a release with a delay of 1h: %v", err)
	}
	if n := markers(t, d, key); n != 0 {
		t.Fatalf("%d markers left after a release", n)
	}
}

// startDelayChild runs TestDelayChild in a child process, and returns
// once it holds key (kill) or released it (release): the child, and the
// path of its node.
func startDelayChild(t *testing.T, ctx context.Context, mode, key string, delay time.Duration) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDelayChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s", delayChildEnv, mode, key, delay))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if path, ok := strings.CutPrefix(sc.Text(), mode+" "); ok {
			go func() {
				for sc.Scan() {
				}
			}()
			return cmd, path
		}
	}
	t.Fatalf("the %s child exited without the lock", mode)
	return nil, ""
}

// TestDelayChild is the child side of TestDelayAfterKill.
func TestDelayChild(t *testing.T) {
	var mode, key, delayText string
	if _, err := fmt.Sscanf(os.Getenv(delayChildEnv), "%s %s %s", &mode, &key, &delayText); err != nil {
		t.Skip("TestDelayAfterKill runs this in a child process")
	}
	delay, err := time.ParseDuration(delayText)
	if err != nil {
		t.Fatal(err)
	}
	d := dial(t, testenv.ZKAddrs())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := lockFor(t, key)
	l.Delay = delay
	if _, err := d.TryAcquire(ctx, l); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	path := d.holds[l.Token].path
	d.mu.Unlock()
	if mode == "release" {
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		fmt.Println(mode, path)
		return
	}
	fmt.Println(mode, path)
	time.Sleep(time.Minute) // until killed
}

// markerState reads the state of the one delay marker of key's lock.
func markerState(t *testing.T, d *Driver, key string) byte {
	t.Helper()
	parent := d.parentPath(key)
	for _, n := range children(t, d, parent) {
		if _, ok := markerHash(n); ok {
			data, _, err := d.conn.Get(parent + "/" + n)
			if err != nil {
				t.Fatal(err)
			}
			state, _, _, _ := parseMarker(data)
			return state
		}
	}
	t.Fatalf("no marker of %q", key)
	return 0
}

// A waiter with a delay marks its marker waiting: lost while it waits, it
// delays nobody; queued again with the same token (the Client's requeue),
// it takes its old marker back; granted, its marker is held again.
func TestDelayWaiterLost(t *testing.T) {
	t.Parallel()
	servers := testenv.ZKAddrs()
	holder, waiter, other := dial(t, servers), dial(t, servers), dial(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	expire := func() {
		t.Helper()
		sid := waiter.conn.SessionID()
		_, g := drivers.bySession(sid)
		_, passwd := drivers.credentials(waiter)
		g.close()
		err := expireSession(servers, sid, passwd)
		g.open()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, requeue := range []bool{false, true} {
		key := uniqueKey(t)
		h := lockFor(t, key)
		if _, err := holder.TryAcquire(ctx, h); err != nil {
			t.Fatal(err)
		}
		l := lockFor(t, key)
		l.Delay = time.Hour
		_, tk, err := waiter.Enqueue(ctx, l)
		if err != nil || tk == nil {
			t.Fatalf("Enqueue behind a holder: %v, %v", tk, err)
		}
		if s := markerState(t, other, key); s != markWaiting {
			t.Fatalf("a waiter's marker says %q, want %q", s, markWaiting)
		}
		expire()
		for deadline := time.Now().Add(15 * time.Second); ; {
			_, err := tk.Wait(ctx)
			if errors.Is(err, backend.ErrRequeue) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the expired waiter's Wait: %v, want ErrRequeue", err)
			}
		}
		if !requeue {
			// Its marker delays nobody.
			if err := holder.Release(ctx, h); err != nil {
				t.Fatal(err)
			}
			if _, err := other.TryAcquire(ctx, lockFor(t, key)); err != nil {
				t.Fatalf("TryAcquire after a lost waiter's marker: %v", err)
			}
			if n := markers(t, other, key); n != 0 {
				t.Fatalf("%d markers left of the lost waiter", n)
			}
			continue
		}
		_, tk, err = waiter.Enqueue(ctx, l)
		if err != nil || tk == nil {
			t.Fatalf("Enqueue again with the same token: %v, %v", tk, err)
		}
		if s := markerState(t, other, key); s != markWaiting || markers(t, other, key) != 1 {
			t.Fatalf("the requeued waiter's marker says %q, want one saying %q", s, markWaiting)
		}
		if err := holder.Release(ctx, h); err != nil {
			t.Fatal(err)
		}
		for {
			if _, err = tk.Wait(ctx); !errors.Is(err, backend.ErrNotAcquired) {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		if s := markerState(t, other, key); s != markHeld {
			t.Fatalf("the granted waiter's marker says %q, want %q", s, markHeld)
		}
		if err := waiter.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if n := markers(t, other, key); n != 0 {
			t.Fatalf("%d markers after the release", n)
		}
	}
}
