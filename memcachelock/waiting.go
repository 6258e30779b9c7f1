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

// Waiting. memcached cannot notify, so a driver does what it can without
// the store's help, and all of it is advice: who may take a lock is still
// decided by add and cas on the lock's item alone (driver.go), so nothing
// here can let two holders in; lost advice (an evicted item, a crashed
// waiter, a cut connection) costs latency or fairness, never safety.
//
//   - Local order. Per key, the driver keeps its own waiters (tokens whose
//     TryAcquire failed twice: the locker package's waits; a TryAcquire
//     that fails once is not a waiter) in the order of their second failure.
//     While the queue is not empty, only its head goes to the store; others
//     are refused in process, and so is a new token, so a releaser that
//     acquires again at once queues behind the waiters it released to.
//     While a token of this driver holds a key that has waiters (within
//     its TTL), every other token of this driver is refused without a
//     round trip.
//   - Cross-driver turns. A queue head that finds the key held by another
//     driver appends a waiter mark naming its token to the holder's item
//     (append: one round trip, no cas; only if the item carries no mark yet,
//     so one waiter at a time). A release reads the item anyway (gets, then
//     cas); when it finds a mark of a token that is not its own driver's
//     (and it has handed the key to a local waiter localBatch times in a
//     row over such marks), it frees the key and lets the marked waiter
//     take it: its own driver refuses its tokens until it sees the key
//     taken, or for yieldWindow.
//     Marks vanish with the item they were appended to.
//   - Wake-ups (backend.Notifier). A release by this driver wakes this
//     driver's subscribers on the key at once (unless it yields to a remote
//     waiter). Releases elsewhere are seen by one poller per driver: one
//     multi-get of every watched key and its fence counter (which every
//     acquisition moves, so that a hold that came and went between two
//     polls is seen), and a notification for each key that changed. It
//     polls every pollNext for nextFor after one of its waiters marked a
//     holder's item, else every pollMin while the keys change, backing off
//     to pollMax while they do not. So the marked waiter, the one a release
//     elsewhere leaves the key to, is woken within pollNext and a round
//     trip of it (pollMax after a hold longer than nextFor); other drivers'
//     waiters only need to see the key change, to mark the new holder.
const (
	pollMin  = 4 * time.Millisecond
	pollMax  = 16 * time.Millisecond
	pollNext = pollMin / 8 // while our waiter's mark is on the holder's item
	// nextFor is how long after its mark the poller keeps to pollNext
	// (a hold longer than that is seen within pollMax of its release).
	nextFor     = 250 * time.Millisecond
	yieldWindow = 3 * pollMax
	// localBatch is how many local handoffs in a row a release makes over
	// a remote waiter's mark before it yields: a local one costs a
	// goroutine wake-up, a remote one the poll (measured with 8 workers on
	// 2 drivers: 2 gives the most acquisitions per second, at the same
	// waiter p99 as strict turns).
	localBatch = 2
	// A head that was woken and has not tried again within staleAfter has
	// stopped waiting (its caller gave up without a Release, or a
	// TryAcquire that was tried twice is not retried): the next takes its
	// place. A token that failed once and did not come back within
	// onceFor is forgotten, and a waiter that did not try for queueFor.
	staleAfter = 50 * time.Millisecond
	onceFor    = time.Second
	queueFor   = time.Minute
	markSep    = "\x00w:"
	unmarkTag  = "-" // after markSep: a withdrawn mark
)

// keyWait is one key's waiting state in one driver.
type keyWait struct {
	queue    []qent               // local waiters, head first
	once     map[string]time.Time // tokens that failed once: their first failure
	holder   string               // this driver's token holding the key, if any
	until    time.Time            // holder's hold is known to last until then
	subs     map[chan struct{}]struct{}
	notified time.Time // last wake-up sent to subs
	yieldTo  string    // a remote waiter's token our release left the key to
	yieldEnd time.Time // until then
	yielded  uint64    // the fence of the hold we released then
	passed   int       // local handoffs in a row over a remote waiter's mark
	markedBy string    // our token whose mark is on the holder's item
	seen     string    // the poller's last view of the key (seenOf)
	polled   bool      // seen is valid
}

type qent struct {
	token string
	tried time.Time
}

// waits is the driver's waiting state, per key.
type waits struct {
	mu   sync.Mutex
	keys map[string]*keyWait
	// poll is non-nil while the poller runs; a send on it wakes it early.
	poll chan struct{}
	// next: until then, a waiter of ours is marked as the next holder of
	// some key, and the poller polls every pollNext.
	next time.Time
	// swept is how many keys the last sweep left (see get).
	swept int
}

func (w *waits) get(key string) *keyWait {
	if w.keys == nil {
		w.keys = map[string]*keyWait{}
	}
	if len(w.keys) >= 2*w.swept+64 {
		// Keys that nobody released or waits for any more (a TryAcquire
		// that failed once, a hold that was never released) are swept
		// whenever the map has doubled: amortized O(1) per key.
		now := time.Now()
		for k, kw := range w.keys {
			w.tidy(k, kw, now)
		}
		w.swept = len(w.keys)
	}
	kw := w.keys[key]
	if kw == nil {
		kw = &keyWait{}
		w.keys[key] = kw
	}
	return kw
}

// tidy forgets what has lapsed in kw (once-failed tokens, waiters that
// have not tried for queueFor, a hold past its TTL), and drops kw when
// nothing is left.
func (w *waits) tidy(key string, kw *keyWait, now time.Time) {
	for t, at := range kw.once {
		if now.Sub(at) > onceFor {
			delete(kw.once, t)
		}
	}
	kw.queue = slices.DeleteFunc(kw.queue, func(e qent) bool { return now.Sub(e.tried) > queueFor })
	if kw.holder != "" && !now.Before(kw.until) {
		kw.holder = ""
	}
	if len(kw.queue) == 0 && len(kw.once) == 0 && kw.holder == "" && len(kw.subs) == 0 && !now.Before(kw.yieldEnd) {
		delete(w.keys, key)
	}
}

// admission is what TryAcquire may do for a token.
type admission int

const (
	admitGo      admission = iota // go to the store
	admitRefuse                   // refuse in process
	admitCareful                  // look first: our driver yields the key to a remote waiter
)

// admit decides, before any round trip, whether token may try key.
func (d *Driver) admit(key, token string, now time.Time) admission {
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	kw := w.keys[key]
	if kw == nil {
		return admitGo
	}
	if kw.holder != "" && kw.holder != token && now.Before(kw.until) {
		kw.touch(token, now)
		return admitRefuse
	}
	// Every waiter of the locker package is subscribed (it subscribes
	// after its first failure, and queues at its second): with no
	// subscriber left, the queue is of waits that ended (their tokens'
	// releases, which say so, may still be on their way).
	if len(kw.subs) == 0 {
		for _, e := range kw.queue {
			kw.forget(e.token, now)
		}
		kw.queue = kw.queue[:0]
	}
	// Heads that stopped waiting give way.
	for len(kw.queue) > 0 && kw.queue[0].token != token && kw.notified.After(kw.queue[0].tried) && now.Sub(kw.notified) > staleAfter {
		// Still ours for a while, should its mark be on the holder's item.
		kw.forget(kw.queue[0].token, now)
		kw.queue = kw.queue[1:]
	}
	if i := kw.index(token); i > 0 || (i < 0 && len(kw.queue) > 0) {
		kw.touch(token, now)
		return admitRefuse
	}
	if kw.yieldTo != "" && now.Before(kw.yieldEnd) {
		return admitCareful
	}
	return admitGo
}

// forget makes token a once-failed one again: known as this driver's (see
// released), queued again at its next failure.
func (kw *keyWait) forget(token string, now time.Time) {
	if kw.once == nil {
		kw.once = map[string]time.Time{}
	}
	kw.once[token] = now
}

func (kw *keyWait) index(token string) int {
	return slices.IndexFunc(kw.queue, func(e qent) bool { return e.token == token })
}

// touch records a try by token that did not get the key: a second one
// queues it (at the tail: a waiter's second try comes one backoff step
// after its first, so the order is that of arrival but for ties).
func (kw *keyWait) touch(token string, now time.Time) (queued bool) {
	if i := kw.index(token); i >= 0 {
		kw.queue[i].tried = now
		return true
	}
	if _, ok := kw.once[token]; !ok {
		if kw.once == nil {
			kw.once = map[string]time.Time{}
		}
		kw.once[token] = now
		return false
	}
	delete(kw.once, token)
	kw.queue = append(kw.queue, qent{token: token, tried: now})
	return true
}

// failed records that token found key held (holder is the item's value,
// nil when unknown) and says whether token should mark the holder's item.
func (d *Driver) failed(key, token string, holder []byte, now time.Time) (mark bool) {
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	kw := w.get(key)
	queued := kw.touch(token, now)
	if holder != nil {
		// Taken since we yielded (by the waiter, or a third driver): our
		// turn has come and gone.
		kw.yieldTo = ""
	}
	return queued && holder != nil && kw.index(token) == 0 && marked(holder) == "" &&
		(kw.holder == "" || !heldBy(holder, kw.holder))
}

// yielded reports whether the key, found free, has been taken since we
// left it to a remote waiter, by the fence counter fc: if so, or if the
// counter is gone or unreadable, we stop yielding; if not, token's try
// counts as a failed one.
func (d *Driver) yielded(key, token string, fc *memcache.Item, now time.Time) bool {
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	kw := w.keys[key]
	if kw == nil || kw.yieldTo == "" {
		return true
	}
	if fc != nil {
		if n, err := strconv.ParseUint(string(fc.Value), 10, 64); err == nil && n <= kw.yielded {
			kw.touch(token, now)
			return false
		}
	}
	kw.yieldTo = ""
	return true
}

// mark appends token's waiter mark to the lock item lk. Advice only:
// every error is ignored (a missing item means the key was freed, and the
// poller will say so).
func (d *Driver) mark(key, token string) {
	if d.call(func() error { return d.mc.Append(&memcache.Item{Key: lockKey(key), Value: []byte(markSep + token)}) }) == nil {
		w := &d.waits
		w.mu.Lock()
		w.next = time.Now().Add(nextFor)
		w.get(key).markedBy = token
		w.mu.Unlock()
	}
}

// unmarkLater withdraws token's mark from the lock item of key, in the
// background (entered in the gate, so that Close waits for it): a wait
// that ended should not have the holder's driver yield to nobody. It
// appends a withdrawal (markSep, '-', the token) rather than rewriting the
// item: a cas needs the item's expiry, which a get does not return, and
// would make the holder's lock outlive its TTL. If the item is gone, so
// is the mark.
func (d *Driver) unmarkLater(key, token string) {
	_, done, err := d.gate.Enter(context.Background())
	if err != nil {
		return
	}
	go func() {
		defer done()
		_ = d.call(func() error {
			return d.mc.Append(&memcache.Item{Key: lockKey(key), Value: []byte(markSep + unmarkTag + token)})
		})
	}()
}

// granted records that token of this driver holds key until then, if
// the key has waiting state: an uncontended hold costs no state (its first
// local waiter goes to the store, and may mark the item, which our release
// then knows for one of ours).
func (d *Driver) granted(key, token string, until time.Time) {
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next = time.Time{} // as a rule, the marked waiter is this one
	kw := w.keys[key]
	if kw == nil {
		return
	}
	if i := kw.index(token); i >= 0 {
		kw.queue = slices.Delete(kw.queue, i, i+1)
	}
	delete(kw.once, token)
	kw.holder, kw.until = token, until
	kw.yieldTo = ""
	if kw.markedBy == token {
		kw.markedBy = "" // the mark went with the item it was on
	}
}

// extended records a successful refresh; lost, that token does not hold
// key (any more): it neither holds nor waits.
func (d *Driver) extended(key, token string, until time.Time) {
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if kw := w.keys[key]; kw != nil && kw.holder == token {
		kw.until = until
	}
}

func (d *Driver) lost(key, token string) {
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	kw := w.keys[key]
	if kw == nil {
		return
	}
	if kw.holder == token {
		kw.holder = ""
	}
	if i := kw.index(token); i >= 0 {
		kw.queue = slices.Delete(kw.queue, i, i+1)
	}
	delete(kw.once, token)
	if kw.markedBy == token {
		kw.markedBy = ""
		d.unmarkLater(key, token)
	}
	w.tidy(key, kw, time.Now())
}

// released records that token freed key, whose item was v: it yields to
// a remote waiter marked in v, or wakes this driver's waiters.
func (d *Driver) released(key, token string, v []byte) {
	now := time.Now()
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	kw := w.keys[key]
	if kw == nil {
		if remote := marked(v); remote != "" {
			kw = w.get(key)
			kw.yieldTo, kw.yieldEnd = remote, now.Add(yieldWindow)
			kw.yielded, _ = parseValue(v)
		}
		return
	}
	if kw.holder == token {
		kw.holder = ""
	}
	remote := marked(v)
	if remote != "" && (kw.index(remote) >= 0 || kw.once[remote] != (time.Time{})) {
		remote = "" // one of ours
	}
	switch {
	case remote != "" && kw.passed < localBatch && len(kw.queue) > 0:
		kw.passed++ // a local handoff first, which costs no poll
		kw.wake(now)
	case remote != "":
		kw.passed = 0
		kw.yieldTo, kw.yieldEnd = remote, now.Add(yieldWindow)
		kw.yielded, _ = parseValue(v)
	default:
		kw.passed = 0
		kw.wake(now)
	}
	w.tidy(key, kw, now)
}

// marked returns the token of the first waiter mark in v, "" if none.
// Withdrawn marks do not count.
func marked(v []byte) string {
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
// semaphore permit or read-write lock, whose items the poller does not
// watch).
func (d *Driver) wakeKey(key string) {
	w := &d.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if kw := w.keys[key]; kw != nil {
		kw.wake(time.Now())
	}
}

// wake notifies kw's subscribers; w.mu is held.
func (kw *keyWait) wake(now time.Time) {
	if len(kw.subs) == 0 {
		return
	}
	kw.notified = now
	for ch := range kw.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

var _ backend.Notifier = (*Driver)(nil)

// Subscribe implements backend.Notifier: see Waiting above. It reads the
// key's item once, so that a release after it returns is seen however
// soon it is followed by another acquisition (the holder's token changes).
func (d *Driver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("memcachelock: %w", err)
	}
	defer done()
	if err := live(ctx, "subscribe"); err != nil {
		return nil, nil, err
	}
	lk, fk := lockKey(key), fenceKey(key)
	items, err := d.getMulti([]string{lk, fk})
	if err != nil {
		return nil, nil, fmt.Errorf("memcachelock: subscribe: gets: %w", err)
	}
	ch := make(chan struct{}, 1)
	w := &d.waits
	w.mu.Lock()
	kw := w.get(key)
	if kw.subs == nil {
		kw.subs = map[chan struct{}]struct{}{}
	}
	if len(kw.subs) == 0 {
		kw.seen, kw.polled = seenOf(items[lk], items[fk]), true
	} else if h := seenOf(items[lk], items[fk]); kw.polled && h != kw.seen {
		kw.seen = h
		kw.wake(time.Now())
	}
	kw.subs[ch] = struct{}{}
	start := w.poll == nil
	if start {
		w.poll = make(chan struct{}, 1)
	} else {
		select {
		case w.poll <- struct{}{}:
		default:
		}
	}
	poll := w.poll
	w.mu.Unlock()
	if start {
		d.startPoller(poll)
	}
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if kw := w.keys[key]; kw != nil {
				delete(kw.subs, ch)
				w.tidy(key, kw, time.Now())
			}
		})
	}, nil
}

// seenOf is what the poller compares: the holder's token in the lock item
// ("" when free) and the fence counter, which every acquisition moves, so
// that a hold that came and went between two polls is seen.
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

// startPoller runs the poller until no key is watched or the driver
// closes. It is entered in the gate, so Close waits for it.
func (d *Driver) startPoller(poll chan struct{}) {
	_, done, err := d.gate.Enter(context.Background())
	if err != nil {
		d.waits.mu.Lock()
		d.waits.poll = nil
		d.waits.mu.Unlock()
		return
	}
	go func() {
		defer done()
		d.poller(poll)
	}()
}

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
		items, err := d.getMulti(lks)
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
					kw.wake(now)
					changed = true
				case kw.yieldTo != "" && !now.Before(kw.yieldEnd) && !kw.notified.After(kw.yieldEnd):
					// The waiter we yielded to did not come: ours may try.
					kw.wake(now)
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
