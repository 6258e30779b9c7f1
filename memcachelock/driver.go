package memcachelock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// Driver is the memcached driver. See the package documentation.
type Driver struct {
	mc         *memcache.Client
	own        bool                    // we made mc, so Close closes it
	servers    memcache.ServerSelector // mc's server list if Open made it, else nil (see seed)
	restartMax time.Duration           // caps how long a young server refuses (seed); < 0: the TTL
	fenceExp   int32                   // the fence counters' expiration in seconds (WithRetention)
	slots      chan struct{}           // bounds the requests in flight on mc (inFlight)

	gate   backend.Gate // calls in flight, and background cleanups, awaited by Close
	batch  batchStats   // RefreshMany's counts, for tests (batch.go)
	probes probes       // the driver's own connections (restart.go)
	waits  waits        // waiters, holders and the poller (waiting.go)
	held   heldItems    // the items of the locks we hold, as last read (held.go)
	draws  draws        // fences drawn at release for our next acquisitions (fence.go)
}

// Requests in flight on a driver's client, per server: gomemcache dials for
// every request that finds no idle connection, which cost half the CPU with
// a thousand waiters and passed memcached's connection limit; a wait costs
// less. Open keeps as many idle (the default max_idle).
const inFlight = 16

func newSlots(servers int) chan struct{} { return make(chan struct{}, inFlight*max(servers, 1)) }

// call runs f, one of the client's requests, within the driver's bound. A
// request that waited the client's timeout (its only bound) for its turn
// goes anyway, on a connection of its own: requests that hang on a dead
// server must not make the others wait for them one after another.
func (d *Driver) call(f func() error) error {
	if d.slots == nil { // a test's bare Driver
		return f()
	}
	select {
	case d.slots <- struct{}{}:
	default:
		t := time.NewTimer(d.timeout())
		select {
		case d.slots <- struct{}{}:
			t.Stop()
		case <-t.C:
			return f()
		}
	}
	defer func() { <-d.slots }()
	return f()
}

var (
	_ backend.Driver         = (*Driver)(nil)
	_ backend.BatchRefresher = (*Driver)(nil)
	_ backend.Inspector      = (*Driver)(nil)
	_ backend.Breaker        = (*Driver)(nil)
	_ backend.Modal          = (*Driver)(nil)
)

// New returns a driver that uses mc, a client the caller built. Every
// process that locks the same names must give its client the same server
// list in the same order. Close does not close mc. Such a driver cannot see
// mc's server list: it skips the restart check (restart.go) and refreshes
// locks one by one. WithTimeout and WithMaxIdle are an error here (set
// mc.Timeout and mc.MaxIdleConns instead).
func New(mc *memcache.Client, opts ...Option) (*Driver, error) {
	if mc == nil {
		return nil, fmt.Errorf("memcachelock: New: %w: nil client", backend.ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.timeout != 0 || cfg.maxIdle != 0 {
		return nil, fmt.Errorf("memcachelock: New: %w: WithTimeout and WithMaxIdle configure the client that Open makes; set Timeout and MaxIdleConns on your memcache.Client", backend.ErrInvalidOption)
	}
	return &Driver{mc: mc, restartMax: cfg.restartDelay, fenceExp: cfg.retentionSeconds(), slots: newSlots(1)}, nil
}

// Close waits for the calls in flight (each bounded by the client's
// timeout), closes its own idle connections, and closes the client's
// if the driver opened the client itself.
func (d *Driver) Close() error {
	if !d.gate.Close() {
		return fmt.Errorf("memcachelock: close: %w", backend.ErrClosed)
	}
	d.probes.close()
	if d.own {
		return d.mc.Close()
	}
	return nil
}

// live is ctx's end, checked where retried does not (before a pipe, and
// between steps). op is "" for the operator's calls, which the Client's
// error names.
func live(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		if op == "" {
			return fmt.Errorf("memcachelock: %w", context.Cause(ctx))
		}
		return fmt.Errorf("memcachelock: %s: %w", op, context.Cause(ctx))
	}
	return nil
}

// The memcached calls, each repeated once when it failed on a connection the
// server had closed (after a restart, the first call on each pooled one, not
// having reached the server). Each is safe to repeat even if applied: a
// repeated add finds our token and keeps it (claim), a repeated incr skips
// a fence, a repeated cas finds the cas id changed and looks again. Only a
// release applied twice is imprecise: it reports ErrNotHeld.

func staleConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// retried runs f within the driver's bound, unless ctx ended (checked
// before every round trip: gomemcache takes no context), and once more if
// it failed on a stale connection.
func (d *Driver) retried(ctx context.Context, f func() error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	err := d.call(f)
	if staleConn(err) {
		err = d.call(f)
	}
	return err
}

func (d *Driver) get(ctx context.Context, key string) (it *memcache.Item, err error) {
	err = d.retried(ctx, func() (err error) { it, err = d.mc.Get(key); return err })
	return it, err
}

func (d *Driver) add(ctx context.Context, it *memcache.Item) error {
	return d.retried(ctx, func() error { return d.mc.Add(it) })
}

func (d *Driver) cas(ctx context.Context, it *memcache.Item) error {
	return d.retried(ctx, func() error { return d.mc.CompareAndSwap(it) })
}

func (d *Driver) incr(ctx context.Context, key string) (n uint64, err error) {
	err = d.retried(ctx, func() (err error) { n, err = d.mc.Increment(key, 1); return err })
	return n, err
}

// maxAttempts bounds the retries of a step that lost a race (a cas
// conflict, an item that vanished between two commands, a waiter's mark
// appended to the item: at most one per waiting driver, as a rule one).
const maxAttempts = 8

// enter begins every call with a claim: checkClaim, then begin.
func (d *Driver) enter(ctx context.Context, op string, c backend.Claim) (_ context.Context, done func(), exp int32, eff time.Duration, err error) {
	if op == "release" {
		c.TTL = time.Second // a release needs no TTL: check the rest
	}
	if exp, eff, err = checkClaim(c, time.Now()); err != nil {
		return nil, nil, 0, 0, err
	}
	ctx, done, err = d.begin(ctx, op)
	return ctx, done, exp, eff, err
}

// checkClaim checks c's TTL, as expiration exp and the effective TTL, its
// token and, for a permit, its limit.
func checkClaim(c backend.Claim, now time.Time) (exp int32, eff time.Duration, err error) {
	if exp, eff, err = expiration(c.TTL, now); err != nil {
		return 0, 0, err
	}
	if err := checkToken(c.Token); err != nil {
		return 0, 0, err
	}
	if c.Mode == backend.Permit {
		return exp, eff, checkLimit(c.Limit)
	}
	return exp, eff, nil
}

// begin enters the gate and checks ctx.
func (d *Driver) begin(ctx context.Context, op string) (context.Context, func(), error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("memcachelock: %w", err)
	}
	if err := live(ctx, op); err != nil {
		done()
		return nil, nil, err
	}
	return ctx, done, nil
}

// TryAcquire implements backend.Driver for every mode (see Modes).
func (d *Driver) TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) {
	ctx, done, exp, eff, err := d.enter(ctx, "acquire", c)
	if err != nil {
		return backend.Grant{}, err
	}
	defer done()
	switch c.Mode {
	case backend.Exclusive:
		return d.tryLock(ctx, c, exp, eff)
	case backend.Permit:
		return d.tryPermit(ctx, c, exp, eff)
	case backend.Read:
		return d.tryRead(ctx, c, exp, eff)
	case backend.Write:
		return d.tryWrite(ctx, c, exp, eff)
	}
	return backend.Grant{}, fmt.Errorf("memcachelock: %w: mode %v", backend.ErrUnsupported, c.Mode)
}

// tryLock takes the lock with add, or a cas over a tombstone; then draws a
// fence; then confirms it still holds the lock (see drawFence for why).
// Where the item and the counter share a server, tryPiped does it all in one
// round trip when it can.
func (d *Driver) tryLock(ctx context.Context, l backend.Claim, exp int32, eff time.Duration) (backend.Grant, error) {
	lk := lockKey(l.Key)
	fk := lk + fenceSuffix // fenceKey(l.Key)
	now := time.Now()
	if err := d.ourTurn(ctx, l.Key); err != nil {
		return backend.Grant{}, err
	}
	// Release may use the item's cas id alone only within the hold's TTL,
	// and only if the restart check covers it: cas ids start again from 1
	// when memcached restarts, and within that time no other holder's
	// item can exist on a restarted server (see heldItems).
	var keepUntil time.Time
	if d.checkTTL(eff) >= eff {
		keepUntil = now.Add(eff)
	}
	g, value, done, err := d.tryPiped(ctx, l, lk, fk, exp, eff, keepUntil)
	if done {
		return g, err
	}
	// On an error, the add or cas may have been applied all the same (a
	// timeout after the server stored it): take back what we may have left.
	if value == nil {
		value = holdValue(l.Token, l.Owner)
		won, holder, err := d.claim(ctx, &memcache.Item{Key: lk, Value: value, Expiration: exp}, l.Token)
		if err != nil {
			return d.backedOut(ctx, lk, l.Token, err)
		}
		if !won {
			d.foundHeld(ctx, l.Key, holder)
			return backend.Grant{}, fmt.Errorf("memcachelock: %w", backend.ErrNotAcquired)
		}
	}
	if err := live(ctx, "acquire"); err != nil {
		return d.backedOut(ctx, lk, l.Token, err)
	}
	fence, cur, addr, err := d.drawFence(lk, fk, eff)
	if err != nil {
		return d.backedOut(ctx, lk, l.Token, err)
	}
	if err := d.confirm(ctx, lk, l, value, fence, exp, cur, addr, keepUntil); err != nil {
		if errors.Is(err, backend.ErrNotAcquired) {
			return backend.Grant{}, err
		}
		return d.backedOut(ctx, lk, l.Token, err)
	}
	d.granted(l.Key)
	return backend.Grant{Fence: fence, TTL: eff}, nil
}

// tryPiped is tryLock in one write, which adds the item with its fence in it
// (after pipedMark) and reads back the item and the counter: with the fence
// drawn at our last release of the key (see draws), granted if the counter
// still shows it; else with a seed from the clock, whose add goes before the
// gets, granted if it created the counter, as seed's is. done says that it
// decided (g, err); else a value not nil is our stored item, whose fence
// does not hold (tryLock draws one and confirms), and nil the usual path.
func (d *Driver) tryPiped(ctx context.Context, l backend.Claim, lk, fk string, exp int32, eff time.Duration, keepUntil time.Time) (g backend.Grant, value []byte, done bool, err error) {
	addr := d.pipeAddr(lk, fk)
	if addr == nil {
		return g, nil, false, nil
	}
	fence, drawn := d.draws.take(l.Key)
	if !drawn {
		fence = uint64(time.Now().UnixMicro())
	}
	keep := func() {
		if drawn {
			d.draws.put(l.Key, fence) // unused, still good
		}
	}
	value = holderValue(l.Token, pipedMark, fence, l.Owner)
	cmd, n, check := appendAdd(nil, lk, exp, value), 1, time.Duration(0)
	if !drawn {
		// The seed's add, checked as seed's is.
		cmd, n, check = appendAdd(cmd, fk, d.fenceExp, strconv.AppendUint(nil, fence, 10)), 2, d.checkTTL(eff)
	}
	lines, items, err := d.pipe(addr, check, false, cmd, n, lk, fk)
	line, cur := "", items[lk]
	if err == nil {
		line = lines[0]
	}
	var refused *backend.NotAcquiredError
	switch {
	case errors.Is(err, errBusy), errors.As(err, &refused):
		// Nothing sent. (A young server may still grant a name whose
		// counter it has: the usual path tells.)
		keep()
		return g, nil, false, nil
	case err != nil:
		d.backOut(ctx, lk, l.Token, false) // see tryLock
		return g, nil, true, fmt.Errorf("memcachelock: add: %w", err)
	case line == "NOT_STORED" && (cur == nil || !heldBy(cur.Value, l.Token)):
		keep()
		if cur == nil || isTombstone(cur.Value) {
			return g, nil, false, nil // freed since, or a tombstone: the usual path
		}
		d.foundHeld(ctx, l.Key, cur.Value)
		return g, nil, true, fmt.Errorf("memcachelock: %w", backend.ErrNotAcquired)
	case line != "STORED" && line != "NOT_STORED":
		d.backOut(ctx, lk, l.Token, false)
		return g, nil, true, fmt.Errorf("memcachelock: add: unexpected reply %q", line)
	case cur == nil || !heldBy(cur.Value, l.Token):
		return g, nil, true, fmt.Errorf("memcachelock: %w: the lock expired or was evicted before the acquisition completed", backend.ErrNotAcquired)
	}
	// Our item is stored (NOT_STORED with our token: a repeated add, see
	// onProbe, whose first one was applied).
	if drawn && !shows(items[fk], fence) || !drawn && lines[1] != "STORED" {
		return g, value, false, nil // another fence was drawn since ours, or the counter exists: draw one
	}
	if !keepUntil.IsZero() {
		d.held.keep(l.Key, l.Token, cur.CasID, cur.Value, keepUntil)
	}
	d.granted(l.Key)
	return backend.Grant{Fence: fence, TTL: eff}, nil, true, nil
}

// confirm checks that the item we created, holding value, is still there,
// so that the fence was drawn while we held the lock, and records the fence
// in it with a cas, for Inspect and Break. If addr is not nil, drawFence read
// the item after the draw (cur, nil if gone), and the cas goes to addr with
// a gets of the item, which Release will use until then (see heldItems).
func (d *Driver) confirm(ctx context.Context, lk string, l backend.Claim, value []byte, fence uint64, exp int32, cur *memcache.Item, addr net.Addr, until time.Time) error {
	lapsed := fmt.Errorf("memcachelock: %w: the lock expired or was evicted before the acquisition completed", backend.ErrNotAcquired)
	if addr != nil && cur == nil {
		return lapsed
	}
	put := d.cas
	if addr != nil {
		put = func(ctx context.Context, it *memcache.Item) error { return d.casRead(ctx, addr, it, l, until) }
	}
	_, err := d.casHeld(ctx, "acquire", "lock", lk, cur, heldCheck(l.Token), func(cur *memcache.Item) *memcache.Item {
		// Waiter marks appended since the add stay (see Waiting).
		var marked []byte
		if bytes.HasPrefix(cur.Value, value) {
			marked = cur.Value[len(value):]
		}
		cur.Value, cur.Expiration = append(fencedValue(l.Token, fence, l.Owner), marked...), exp
		return cur
	}, put)
	if errors.Is(err, backend.ErrNotHeld) {
		return lapsed
	}
	return err
}

// claim stores item (holding token) if the key is free: absent, expired, or
// a tombstone. It reports false when another token holds the key, with the
// holder's value when it read one.
func (d *Driver) claim(ctx context.Context, item *memcache.Item, token string) (won bool, holder []byte, err error) {
	for range maxAttempts {
		err = d.add(ctx, item)
		switch {
		case err == nil:
			return true, nil, nil
		case !errors.Is(err, memcache.ErrNotStored):
			return false, nil, fmt.Errorf("memcachelock: add: %w", err)
		}
		// Something is there: a holder, or a tombstone a server kept.
		cur, err := d.get(ctx, item.Key)
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			continue // gone since the add: try again
		case err != nil:
			return false, nil, fmt.Errorf("memcachelock: gets: %w", err)
		case heldBy(cur.Value, token):
			// Only this acquisition writes this token, so this is an add
			// of ours whose reply was lost. Keep it, with a fresh expiry.
		case !isTombstone(cur.Value):
			return false, cur.Value, nil
		}
		over := *item
		over.CasID = cur.CasID
		err = d.cas(ctx, &over)
		switch {
		case err == nil:
			return true, nil, nil
		case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrNotStored):
			continue // changed since our gets: look again
		default:
			return false, nil, fmt.Errorf("memcachelock: cas: %w", err)
		}
	}
	// The key kept changing under us: someone else is active on it.
	return false, nil, nil
}

// Refresh extends the lock with gets and cas, so it never extends another
// holder's lock (touch, which checks nothing, could).
func (d *Driver) Refresh(ctx context.Context, c backend.Claim) error {
	ctx, done, exp, _, err := d.enter(ctx, "refresh", c)
	if err != nil {
		return err
	}
	defer done()
	return d.refresh(ctx, c, exp)
}

// refresh is Refresh for a call in flight, with c.TTL as expiration exp.
func (d *Driver) refresh(ctx context.Context, c backend.Claim, exp int32) error {
	switch c.Mode {
	case backend.Exclusive:
		d.held.take(c.Key, c.Token) // the refresh changes the item's cas id
		return d.extend(ctx, "refresh", "lock", lockKey(c.Key), c.Token, exp)
	case backend.Permit:
		return d.refreshPermit(ctx, c, exp)
	case backend.Read:
		return d.refreshSlot(ctx, c, exp)
	case backend.Write:
		return d.extend(ctx, "refresh", "writer", objKey(c.Key, "w"), c.Token, exp)
	}
	return fmt.Errorf("memcachelock: %w: mode %v", backend.ErrUnsupported, c.Mode)
}

// extend sets the expiration of item key to exp if token holds it (gets,
// then cas). what names the item in errors.
func (d *Driver) extend(ctx context.Context, op, what, key, token string, exp int32) error {
	_, err := d.casHeld(ctx, op, what, key, nil, heldCheck(token), func(cur *memcache.Item) *memcache.Item {
		cur.Expiration = exp
		settle(cur.Value)
		return cur
	}, d.cas)
	return err
}

// heldCheck is casHeld's check that token holds an item.
func heldCheck(token string) func([]byte) error {
	return func(v []byte) error {
		if !heldBy(v, token) {
			return fmt.Errorf("memcachelock: %w: another token holds it", backend.ErrNotHeld)
		}
		return nil
	}
}

// casHeld reads item key (gets, or first, if not nil, the first time) and,
// if check passes its value, stores what next makes of it with put (a cas:
// if the item changed since, it looks again, a bounded number of times). It
// returns the item as read. what names the item in errors.
func (d *Driver) casHeld(ctx context.Context, op, what, key string, first *memcache.Item, check func([]byte) error, next func(*memcache.Item) *memcache.Item, put func(context.Context, *memcache.Item) error) (*memcache.Item, error) {
	for range maxAttempts {
		cur, err := first, error(nil)
		if first == nil {
			cur, err = d.get(ctx, key)
		}
		first = nil
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			return nil, fmt.Errorf("memcachelock: %w: no %s (expired, evicted, released or the server restarted)", backend.ErrNotHeld, what)
		case err != nil:
			return nil, fmt.Errorf("memcachelock: gets: %w", err)
		}
		if err := check(cur.Value); err != nil {
			return nil, err
		}
		if err := live(ctx, op); err != nil { // put may pipe, which takes no ctx
			return nil, err
		}
		err = put(ctx, next(cur))
		switch {
		case err == nil:
			return cur, nil
		case errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrNotStored):
			return nil, fmt.Errorf("memcachelock: %w: no %s (it expired or was evicted just now)", backend.ErrNotHeld, what)
		case errors.Is(err, memcache.ErrCASConflict):
			continue // changed since our gets (a concurrent refresh of ours): look again
		default:
			return nil, fmt.Errorf("memcachelock: cas: %w", err)
		}
	}
	return nil, fmt.Errorf("memcachelock: the %s item kept changing during %d attempts", what, maxAttempts)
}

// Release frees the lock with gets and cas to a tombstone that memcached
// treats as expired at once: memcached has no compare-and-delete, and a
// blind delete could remove the next holder's lock if ours expired.
func (d *Driver) Release(ctx context.Context, c backend.Claim) error {
	ctx, done, _, _, err := d.enter(ctx, "release", c)
	if err != nil {
		return err
	}
	defer done()
	switch c.Mode {
	case backend.Exclusive:
		return d.release(ctx, c)
	case backend.Permit, backend.Read:
		defer d.wakeKey(c.Key) // the poller watches lock items only
		return d.releaseSlot(ctx, c)
	case backend.Write:
		defer d.wakeKey(c.Key)
		return d.releaseWrite(ctx, c)
	}
	return fmt.Errorf("memcachelock: %w: mode %v", backend.ErrUnsupported, c.Mode)
}

// release is Release for a call in flight; it hands the turn on as the
// freed item's marks say (see Waiting).
func (d *Driver) release(ctx context.Context, l backend.Claim) error {
	var first *memcache.Item
	if it, ok := d.held.take(l.Key, l.Token); ok && time.Now().Before(it.until) {
		// The item as our acquisition read it: if unchanged since, one cas
		// frees it; else (a refresh, a mark, an expiry) gets, then cas.
		first = &memcache.Item{Key: lockKey(l.Key), Value: it.value, CasID: it.cas}
	}
	free := func(ctx context.Context, it *memcache.Item) error { return d.freeLock(ctx, l.Key, it) }
	cur, err := d.casHeld(ctx, "release", "lock", lockKey(l.Key), first, heldCheck(l.Token), func(it *memcache.Item) *memcache.Item { return it }, free)
	if err != nil {
		return err
	}
	d.released(l.Key, cur.Value)
	return nil
}

// drop removes item key if token holds it: gets, then a cas to the expired
// tombstone (see Release). what names the item in errors.
func (d *Driver) drop(ctx context.Context, op, what, key, token string) error {
	_, err := d.casHeld(ctx, op, what, key, nil, heldCheck(token), tombstoneOf, d.cas)
	return err
}

// tombstoneOf is the tombstone that replaces cur (see Release).
func tombstoneOf(cur *memcache.Item) *memcache.Item {
	return &memcache.Item{Key: cur.Key, Value: []byte(tombstone), Expiration: releaseExpiration, CasID: cur.CasID}
}
