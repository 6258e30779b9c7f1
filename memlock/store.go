package memlock

import (
	"slices"
	"sync"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Store holds locks in memory.
type Store struct {
	mu    sync.Mutex
	locks map[string]entry
	// fence is the store's one counter: fences increase across all names,
	// so a name needs no state of its own once it is released.
	fence uint64
	subs  map[string]map[chan struct{}]struct{}
	// objects are the semaphores and read-write locks with a holder or a
	// waiting writer.
	objects map[object]*shared
	// queues are the waiters of FairDrivers, per name (fair.go).
	queues map[object][]*ticket
	// limits are the semaphores' limits set by Resize, per key.
	limits map[string]int
}

type entry struct {
	token   string
	owner   string
	fence   uint64
	expires time.Time
	weight  int // a semaphore's holder: the permits it takes
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{
		locks:   map[string]entry{},
		subs:    map[string]map[chan struct{}]struct{}{},
		objects: map[object]*shared{},
		queues:  map[object][]*ticket{},
		limits:  map[string]int{},
	}
}

var (
	namedMu sync.Mutex
	named   = map[string]*Store{}
)

// Named returns the process-wide Store called name, made on first use.
func Named(name string) *Store {
	namedMu.Lock()
	defer namedMu.Unlock()
	s := named[name]
	if s == nil {
		s = NewStore()
		named[name] = s
	}
	return s
}

// held returns the live entry on key; an expired one counts as free.
func (s *Store) held(key string, now time.Time) (entry, bool) {
	e, ok := s.locks[key]
	if ok && !now.Before(e.expires) {
		delete(s.locks, key)
		return entry{}, false
	}
	return e, ok
}

// Expire removes the lock on key as if its TTL had run out, and reports
// whether there was one.
func (s *Store) Expire(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.held(key, time.Now())
	delete(s.locks, key)
	s.notify(key)
	return ok
}

// Keeps reports whether the store keeps anything for key: a lock, held or
// expired and not yet swept, a semaphore or a read-write lock. A released
// name leaves nothing.
func (s *Store) Keeps(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.locks[key]
	for _, k := range kinds {
		ok = ok || len(s.queues[object{key, k}]) > 0
	}
	for o := range s.objects {
		ok = ok || o.key == key
	}
	return ok || s.limits[key] > 0
}

// kinds are the kinds of a key's objects.
var kinds = [...]backend.Mode{backend.Exclusive, backend.Permit, backend.Read}

// notify tells key's subscribers, and the first waiter in each of its
// objects' queues, that it may be free.
func (s *Store) notify(key string) {
	for _, k := range kinds {
		s.wakeFirst(object{key, k})
	}
	for ch := range s.subs[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// dequeue removes t from o's queue and wakes the new first waiter.
func (s *Store) dequeue(o object, t *ticket) {
	q := slices.DeleteFunc(s.queues[o], func(x *ticket) bool { return x == t })
	if len(q) == 0 {
		delete(s.queues, o)
		return
	}
	s.queues[o] = q
	s.wakeFirst(o)
}

// wakeFirst wakes o's first waiter, if any.
func (s *Store) wakeFirst(o object) {
	if q := s.queues[o]; len(q) > 0 {
		select {
		case q[0].turn <- struct{}{}:
		default:
		}
	}
}
