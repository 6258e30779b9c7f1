package sqldb

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// pollEvery is how often a driver with subscribers looks at their keys.
const pollEvery = 50 * time.Millisecond

// hub tells subscribers that a key may have been freed. This driver's own
// releases (Release, Break, an undone acquisition) wake them at once, with
// no SQL. Others' it learns by polling, since the databases have no
// LISTEN/NOTIFY: one goroutine per driver, alive while it has
// subscribers, reads the fences of all their keys in one statement every
// pollEvery, and wakes a key's subscribers when its holder went or
// changed. Nothing of it runs on the uncontended path.
type hub struct {
	mu      sync.Mutex
	subs    map[string]map[chan struct{}]struct{}
	seen    map[string]holders // a key's holders at the last poll
	counter int64              // the table's counter at the last poll, -1 unknown
	polling bool
	done    sync.WaitGroup // the poller
}

func (h *hub) notify(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wake(key)
}

// wake signals key's subscribers; h.mu is held.
func (h *hub) wake(key string) {
	for ch := range h.subs[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Subscribe implements backend.Notifier.
func (d *Driver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	// In the gate, so that Close, which waits for the calls in it first,
	// then waits for a poller this call starts.
	_, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("%s%w", d.prefix("subscribe"), err)
	}
	defer leave()
	ch := make(chan struct{}, 1)
	h := &d.hub
	h.mu.Lock()
	if h.subs == nil {
		h.subs, h.seen = make(map[string]map[chan struct{}]struct{}), make(map[string]holders)
	}
	if h.subs[key] == nil {
		h.subs[key] = make(map[chan struct{}]struct{})
	}
	h.subs[key][ch] = struct{}{}
	if !h.polling {
		h.polling = true
		h.done.Add(1)
		go d.poll()
	}
	h.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			delete(h.subs[key], ch)
			if len(h.subs[key]) == 0 {
				delete(h.subs, key)
				delete(h.seen, key)
			}
		})
	}, nil
}

// poll is the hub's goroutine: it runs until no key has a subscriber, or
// Close.
func (d *Driver) poll() {
	h := &d.hub
	defer h.done.Done()
	stop := d.gate.Context()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		select {
		case <-stop.Done():
			h.mu.Lock()
			h.polling = false
			h.mu.Unlock()
			return
		case <-t.C:
		}
		h.mu.Lock()
		keys := make([]string, 0, len(h.subs))
		for k := range h.subs {
			keys = append(keys, k)
		}
		if len(keys) == 0 {
			h.polling = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(stop, time.Second)
		counter, err := d.counter(ctx)
		var fences map[string]holders
		if err == nil {
			fences, err = d.fences(ctx, keys)
		}
		cancel()
		if err != nil {
			continue // the waiters' own tries report it
		}
		h.mu.Lock()
		moved := counter < 0 || counter != h.counter
		h.counter = counter
		for _, k := range keys {
			if h.subs[k] == nil {
				continue // unsubscribed meanwhile
			}
			now := fences[k]
			prev, known := h.seen[k]
			// Its holders changed since the last look (a release, a
			// takeover: new grants have new fences; a tombstone's fence
			// tells a name taken and freed between two looks), other
			// than by a grant to a free name; or it is free, and maybe
			// taken and freed since (some grant moved the counter), or
			// at the first look, which may come after a release that
			// followed Subscribe. A wake-up too many costs one try.
			changed := known && prev != now && (prev.n > 0 || now.n == 0)
			if changed || now.n == 0 && (!known || moved) {
				h.wake(k)
			}
			h.seen[k] = now
		}
		h.mu.Unlock()
	}
}

// counter returns the table's grant counter, or -1 when the dialect has
// none.
func (d *Driver) counter(ctx context.Context) (int64, error) {
	if d.sql.counter == "" {
		return -1, nil
	}
	var n int64
	err := d.db.QueryRowContext(ctx, d.sql.counter).Scan(&n)
	return n, err
}

// holders sums up a key's live holders: a change in the set changes it,
// since every grant has a new fence.
type holders struct{ n, max, xor int64 }

// fences returns the holders of each of keys that has any.
func (d *Driver) fences(ctx context.Context, keys []string) (map[string]holders, error) {
	out := make(map[string]holders, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), d.sql.maxBatch)
		args := make([]any, 2*n)
		for i, k := range keys[:n] {
			args[i], args[n+i] = k, k
		}
		rows, err := d.db.QueryContext(ctx, d.sql.fences(n), args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var (
				name string
				h    holders
			)
			if err := rows.Scan(&name, &h.n, &h.max, &h.xor); err != nil {
				rows.Close()
				return nil, err
			}
			sum := out[name]
			out[name] = holders{sum.n + h.n, max(sum.max, h.max), sum.xor ^ h.xor}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
		keys = keys[n:]
	}
	return out, nil
}
