package memcachelock

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// Waiting. memcached cannot notify, so the driver tells its waiters of
// releases itself (a release through it, or its poller), and drivers take
// turns: a driver with waiters marks the holder's item (append), and a
// release that finds another driver's mark leaves the key to it for a
// while. All of it is advice: add and cas on the lock's item alone decide
// who holds it, so lost advice costs latency or fairness, never safety.
// docs/backends/memcachelock.md, "Waiting".
const (
	pollMin  = 4 * time.Millisecond
	pollMax  = 16 * time.Millisecond
	pollNext = pollMin / 8 // while our mark is on the holder's item
	// nextFor is how long after its mark the poller keeps to pollNext
	// (a hold longer than that is seen within pollMax of its release).
	nextFor     = 250 * time.Millisecond
	yieldWindow = 3 * pollMax
	// localBatch is how many local wake-ups in a row a release makes over
	// another driver's mark before it yields: a local one costs a
	// goroutine wake-up, a remote one the poll.
	localBatch = 2
	markSep    = "\x00w:"
	unmarkTag  = "-" // after markSep: a withdrawn mark
)

// keyWait is one key's waiting state in one driver.
type keyWait struct {
	subs     map[chan struct{}]struct{}
	yieldEnd time.Time // until then, our release left the key to another driver
	yielded  uint64    // the fence of the hold we released then
	passed   int       // local wake-ups in a row over another driver's mark
	marked   bool      // our mark is on the holder's item
	seen     string    // the poller's last view of the key (seenOf)
	polled   bool      // seen is valid
}

// waits is the driver's waiting state, per key.
type waits struct {
	mu   sync.Mutex
	id   string // names this driver in its marks ("" until it marks)
	keys map[string]*keyWait
	// poll is non-nil while the poller runs; a send on it wakes it early.
	poll chan struct{}
	// next: until then, our mark is on a holder's item: poll every pollNext.
	next time.Time
	// swept is how many keys the last sweep left (see get).
	swept int
}

func (w *waits) get(key string) *keyWait {
	if w.keys == nil {
		w.keys = map[string]*keyWait{}
	}
	// Keys nobody waits for any more go.
	sweep(w.keys, &w.swept, func(kw *keyWait, now time.Time) bool { return len(kw.subs) == 0 && !now.Before(kw.yieldEnd) })
	kw := w.keys[key]
	if kw == nil {
		kw = &keyWait{subs: map[chan struct{}]struct{}{}}
		w.keys[key] = kw
	}
	return kw
}

// ourTurn refuses a try of key (ErrNotAcquired) while we leave the key to
// another driver not yet seen to take it: the fence counter tells whether
// anyone took it since; a counter gone or unreadable ends the turn we left.
func (d *Driver) ourTurn(ctx context.Context, key string) error {
	w := &d.waits
	w.mu.Lock()
	kw := w.keys[key]
	yielding := kw != nil && time.Now().Before(kw.yieldEnd)
	w.mu.Unlock()
	if !yielding {
		return nil
	}
	refused := fmt.Errorf("memcachelock: %w", backend.ErrNotAcquired)
	lk, fk := lockKey(key), fenceKey(key)
	items, err := d.getMulti(ctx, []string{lk, fk})
	if err != nil {
		return fmt.Errorf("memcachelock: gets: %w", err)
	}
	if cur := items[lk]; cur != nil && !isTombstone(cur.Value) {
		d.foundHeld(ctx, key, cur.Value)
		return refused
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if fc := items[fk]; fc != nil {
		if n, err := strconv.ParseUint(string(fc.Value), 10, 64); err == nil && n <= kw.yielded {
			return refused
		}
	}
	kw.yieldEnd = time.Time{}
	return nil
}

// foundHeld records that a try found key held, by the item's value holder
// (nil when unread), which it marks if this driver has waiters on the key
// and the item carries no mark. Advice only: every error is ignored.
func (d *Driver) foundHeld(ctx context.Context, key string, holder []byte) {
	w := &d.waits
	w.mu.Lock()
	kw := w.keys[key]
	if kw != nil && holder != nil {
		kw.yieldEnd = time.Time{} // taken since we yielded: our turn has come
	}
	mark := kw != nil && holder != nil && len(kw.subs) > 0 && marked(holder) == "" && ctx.Err() == nil
	if mark && w.id == "" {
		w.id = strconv.FormatUint(rand.Uint64(), 36)
	}
	id := w.id
	w.mu.Unlock()
	if !mark || d.call(func() error { return d.mc.Append(&memcache.Item{Key: lockKey(key), Value: []byte(markSep + id)}) }) != nil {
		return
	}
	w.mu.Lock()
	kw = w.keys[key]
	ours := kw != nil && len(kw.subs) > 0
	if ours {
		kw.marked = true
		w.next = time.Now().Add(nextFor)
	}
	w.mu.Unlock()
	if !ours {
		d.unmarkLater(key, id) // our waiters left meanwhile
	}
}

// unmarkLater withdraws this driver's mark from the lock item of key, in
// the background, so that the holder's driver does not yield to nobody. It
// appends a withdrawal: a cas would need the item's expiry, which a get
// does not return.
func (d *Driver) unmarkLater(key, id string) {
	d.spawn(func() {
		_ = d.call(func() error {
			return d.mc.Append(&memcache.Item{Key: lockKey(key), Value: []byte(markSep + unmarkTag + id)})
		})
	})
}

// spawn runs f in a goroutine entered in the gate, so that Close waits for
// it; it reports false, and runs nothing, once Close has begun.
func (d *Driver) spawn(f func()) bool {
	_, done, ok := d.gate.Background()
	if !ok {
		return false
	}
	go func() {
		defer done()
		f()
	}()
	return true
}

// granted records that a token of this driver took key: the item our mark
// was on is gone, and the turn we left to others is over.
func (d *Driver) granted(key string) {
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next = time.Time{} // as a rule, the marked waiter is this one
	if kw := w.keys[key]; kw != nil {
		kw.marked, kw.yieldEnd = false, time.Time{}
	}
}

// released records that this driver freed key, whose item was v: it
// yields to another driver marked in v, or wakes this driver's waiters.
func (d *Driver) released(key string, v []byte) {
	drawn := d.draws.peek(key) // our release's incr, which ourTurn must not take for another's hold
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	kw := w.keys[key]
	other := marked(v)
	switch {
	case other == "" || other == w.id:
		if kw != nil {
			kw.passed = 0
			kw.wake()
		}
	case kw != nil && kw.passed < localBatch && len(kw.subs) > 0:
		kw.passed++ // a local wake-up first, which costs no poll
		kw.wake()
	default:
		kw = w.get(key)
		kw.passed = 0
		kw.yieldEnd = time.Now().Add(yieldWindow)
		kw.yielded, _, _ = parseValue(v)
		kw.yielded = max(kw.yielded, drawn)
	}
}

// marked returns the id in the first mark in v, "" if none. Withdrawn
// marks do not count.
func marked(v []byte) string {
	if len(marks(v)) == 0 {
		return ""
	}
	ms := bytes.Split(marks(v), []byte(markSep))
	for i, m := range ms {
		if len(m) == 0 || m[0] == unmarkTag[0] {
			continue
		}
		if !slices.ContainsFunc(ms[i+1:], func(w []byte) bool {
			return len(w) == len(unmarkTag)+len(m) && string(w[len(unmarkTag):]) == string(m)
		}) {
			return string(m)
		}
	}
	return ""
}

// wakeKey wakes this driver's subscribers on key (after a release of a
// permit or a read-write lock, whose items the poller does not watch).
func (d *Driver) wakeKey(key string) {
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if kw := w.keys[key]; kw != nil {
		kw.wake()
	}
}

// wake notifies kw's subscribers; w.mu is held.
func (kw *keyWait) wake() {
	for ch := range kw.subs {
		backend.Notify(ch)
	}
}

var _ backend.Notifier = (*Driver)(nil)

// Subscribe implements backend.Notifier (see Waiting). It reads the key's
// items once, so that a release after it returns is seen however soon
// another acquisition follows.
func (d *Driver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	ctx, done, err := d.begin(ctx, "subscribe")
	if err != nil {
		return nil, nil, err
	}
	defer done()
	lk, fk := lockKey(key), fenceKey(key)
	items, err := d.getMulti(ctx, []string{lk, fk})
	if err != nil {
		return nil, nil, fmt.Errorf("memcachelock: subscribe: gets: %w", err)
	}
	ch := make(chan struct{}, 1)
	w := &d.waits
	w.mu.Lock()
	kw := w.get(key)
	if len(kw.subs) == 0 {
		kw.seen, kw.polled = seenOf(items[lk], items[fk]), true
	} else if h := seenOf(items[lk], items[fk]); kw.polled && h != kw.seen {
		kw.seen = h
		kw.wake()
	}
	kw.subs[ch] = struct{}{}
	start := w.poll == nil
	if start {
		w.poll = make(chan struct{}, 1)
	} else {
		backend.Notify(w.poll)
	}
	poll := w.poll
	w.mu.Unlock()
	if start && !d.spawn(func() { d.poller(poll) }) {
		w.mu.Lock()
		w.poll = nil
		w.mu.Unlock()
	}
	return ch, sync.OnceFunc(func() {
		w.mu.Lock()
		delete(kw.subs, ch)
		unmark := len(kw.subs) == 0 && kw.marked
		if unmark {
			kw.marked = false
		}
		id := w.id
		w.mu.Unlock()
		if unmark {
			d.unmarkLater(key, id)
		}
	}), nil
}

// seenOf is what the poller compares: the holder's token ("" when free) and
// the fence counter, which shows a hold that came and went between polls.
func seenOf(lock, counter *memcache.Item) string {
	var tok []byte
	if lock != nil && !isTombstone(lock.Value) {
		tok, _, _ = bytes.Cut(lock.Value, []byte(" "))
	}
	if counter == nil {
		return string(tok)
	}
	return string(tok) + "/" + string(counter.Value)
}

// poller polls the watched keys until none is or the driver closes.
func (d *Driver) poller(poll chan struct{}) {
	closing := d.gate.Context()
	w := &d.waits
	interval := pollMin
	timer := time.NewTimer(jitter(interval))
	defer timer.Stop()
	var keys, lks []string
	for {
		select {
		case <-closing.Done():
			w.mu.Lock()
			w.poll = nil
			w.mu.Unlock()
			return
		case <-poll:
			interval = pollMin
		case <-timer.C:
		}
		keys, lks = keys[:0], lks[:0]
		w.mu.Lock()
		for k, kw := range w.keys {
			if len(kw.subs) > 0 {
				keys, lks = append(keys, k), append(lks, lockKey(k), fenceKey(k))
			}
		}
		if len(keys) == 0 {
			w.poll = nil
			w.mu.Unlock()
			return
		}
		next := w.next
		w.mu.Unlock()
		items, err := d.getMulti(context.Background(), lks)
		changed := false
		if err == nil {
			now := time.Now()
			w.mu.Lock()
			for i, k := range keys {
				kw := w.keys[k]
				if kw == nil || len(kw.subs) == 0 {
					continue
				}
				h := seenOf(items[lks[2*i]], items[lks[2*i+1]])
				switch {
				case !kw.polled || h != kw.seen:
					kw.seen, kw.polled = h, true
					kw.wake()
					changed = true
				case !kw.yieldEnd.IsZero() && !now.Before(kw.yieldEnd):
					// The driver we yielded to did not come: ours may try.
					kw.yieldEnd = time.Time{}
					kw.wake()
				}
			}
			w.mu.Unlock()
		}
		if changed {
			interval = pollMin
		} else {
			interval = min(interval*3/2, pollMax)
		}
		if time.Now().Before(next) {
			timer.Reset(jitter(pollNext))
			continue
		}
		timer.Reset(jitter(interval))
	}
}

// jitter spreads d over ±25%, so that the pollers of many drivers do not
// fall into step.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}
