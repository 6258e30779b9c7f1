package locker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A LockSet is the locks on several names, taken all or nothing by
// AcquireAll, TryAcquireAll or DoAll and then held as one: released and
// refreshed together, and lost as soon as any of them is.
//
// The names are taken one at a time in one order, their byte order,
// whatever order the caller gives: two callers that ask for {a, b} and
// {b, a} at once cannot deadlock, since both queue for a first. A caller
// holds the names it has taken while it waits for the next (that is what
// keeps a waiter for {a, b} from being starved by single holders of b),
// and gives them all back when it cannot take the rest: nobody sees a part
// of the set held once the call has returned, except where the store did
// not confirm giving one back, which then stays held until its TTL, as any
// unconfirmed release does.
type LockSet struct {
	locks []*Lock // in the names' byte order
	// Lost's channel, made at its first call: a set nobody asks costs no
	// watch on its locks.
	mu       sync.Mutex
	lost     chan struct{}
	once     sync.Once // closes lost
	stops    []func()
	released bool // no more watches: Release stopped them
}

// AcquireAll takes the locks on every name, waiting for each in turn (see
// LockSet), with opts applied to each. WaitAtMost bounds the wait for the
// whole set. It returns an error wrapping ErrNotAcquired, with the name it
// could not take, when a wait ends without the lock; every lock it took is
// released by then. Duplicate names count once.
func (c *Client) AcquireAll(ctx context.Context, names []string, opts ...LockOption) (*LockSet, error) {
	return c.acquireAll(ctx, names, true, opts)
}

// TryAcquireAll takes the locks on every name if all are free, and
// otherwise returns an error wrapping ErrNotAcquired that names the first
// held one, holding none of them.
func (c *Client) TryAcquireAll(ctx context.Context, names []string, opts ...LockOption) (*LockSet, error) {
	return c.acquireAll(ctx, names, false, opts)
}

// DoAll is Do for a set of names: it takes them as AcquireAll does, runs fn
// with a context that is cancelled, with the loss as its cause, if any of
// them is lost, and releases them all on every path. fn gets the set, for
// its fences.
func (c *Client) DoAll(ctx context.Context, names []string, fn func(context.Context, *LockSet) error, opts ...LockOption) (err error) {
	s, err := c.acquireAll(ctx, names, true, opts)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stops := make([]func(), len(s.locks))
	for i, l := range s.locks {
		stops[i] = l.h.afterLost(cancel)
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
		cancel(nil)
		rerr := s.Release(ctx)
		if lost := s.Err(); lost != nil {
			if !errors.Is(err, lost) {
				err = errors.Join(err, lost)
			}
		} else {
			err = errors.Join(err, rerr)
		}
	}()
	return fn(fctx, s)
}

func (c *Client) acquireAll(ctx context.Context, names []string, wait bool, opts []LockOption) (*LockSet, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("locker: a lock set needs at least one name: %w", ErrInvalidName)
	}
	names = slices.Clone(names)
	slices.Sort(names)
	names = slices.Compact(names)
	for _, n := range names {
		if err := CheckName(n); err != nil {
			return nil, err
		}
	}
	var lc lockConfig
	for _, o := range opts {
		o(&lc)
	}
	if wait && lc.waitSet {
		if lc.waitMax <= 0 {
			wait = false
		} else {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, lc.waitMax)
			defer cancel()
		}
		// The set's wait is bounded once, not name by name.
		opts = append(slices.Clip(opts), func(c *lockConfig) { c.waitSet = false })
	}
	s := &LockSet{locks: make([]*Lock, 0, len(names))}
	var err error
	if sa, ok := backend.As[backend.SetAcquirer](c.drv); ok && len(names) > 1 && lc.mode == backend.Exclusive && lc.reentrant == "" {
		err = c.takeSet(ctx, sa, s, names, wait, opts)
	} else {
		for _, n := range names {
			if err = s.add(c.acquire(ctx, n, wait, opts)); err != nil {
				break
			}
		}
	}
	if err != nil {
		return nil, errors.Join(err, s.giveBack(ctx))
	}
	return s, nil
}

// add adds a lock just taken to the set, or returns the error of its
// acquisition; then held's.
func (s *LockSet) add(l *Lock, err error) error {
	if err != nil {
		return err
	}
	s.locks = append(s.locks, l)
	return s.held()
}

// held returns the error of a name taken and lost while a later one was
// awaited: the set is not held then.
func (s *LockSet) held() error {
	if err := s.Err(); err != nil {
		return fmt.Errorf("locker: lock set: %w: %w", ErrNotAcquired, err)
	}
	return nil
}

// takeSet takes names with one request where the store can (a
// backend.SetAcquirer): all at once when all are free. Otherwise, or when
// a wait may ride out what the request met, it takes them one at a time
// in their order, as for any store, with the attempts already begun.
func (c *Client) takeSet(ctx context.Context, sa backend.SetAcquirer, s *LockSet, names []string, wait bool, opts []LockOption) error {
	as := make([]attempt, len(names))
	locks := make([]*Lock, len(names))
	errs := make([]error, len(names))
	begun, done := 0, 0 // attempts begun; attempts finished, in order
	defer func() {
		for i := range as[:begun] {
			if i >= done && errs[i] == nil {
				// Begun, never finished: its hold goes, unused.
				c.abandon(as[i].h)
				errs[i] = fmt.Errorf("locker: %s %q: %w: not tried, the set failed first", as[i].op, as[i].name, ErrNotAcquired)
			}
			as[i].end(&locks[i], &errs[i])
		}
	}()
	claims := make([]backend.Claim, len(names))
	for i, n := range names {
		ok, err := c.begin(&as[i], ctx, n, wait, opts)
		if ok {
			begun++
		}
		if err != nil {
			errs[i] = err
			return err
		}
		claims[i] = as[i].req
	}
	if claims[0].Delay > 0 {
		// A session's lock-delay marker is the driver's, one claim at a
		// time (every claim of a set has the same options).
		return c.takeInOrder(s, as, locks, errs, &done)
	}
	start, ctx := time.Now(), as[0].ctx // the gate's: Close ends it
	grants, err := sa.TryAcquireAll(ctx, claims)
	for i := range as {
		as[i].st.tried(err)
	}
	short := err == nil && len(grants) != len(claims)
	if short {
		// Given back, these claims are tried no more: a name taken
		// again with one would be freed by its give-back.
		err = fmt.Errorf("the driver granted %d claims of %d", len(grants), len(claims))
		for _, cl := range claims {
			c.releaseLater(cl)
		}
	}
	if err == nil {
		// Every name is the set's now: each one joins it, or is given
		// back by finish (a Close meanwhile).
		for ; done < len(as); done++ {
			locks[done], errs[done] = as[done].finish(grants[done], start, nil)
			if errs[done] != nil {
				err = cmp.Or(err, errs[done])
				continue
			}
			s.locks = append(s.locks, locks[done])
		}
		return cmp.Or(err, s.held())
	}
	if errors.Is(err, ErrUnsupported) {
		// Not this set in one request (names in several Redis Cluster
		// slots, say): name by name, as any store.
		return c.takeInOrder(s, as, locks, errs, &done)
	}
	if short || ctx.Err() != nil || !(wait || errors.Is(err, ErrNotAcquired)) {
		// Nothing to wait for: every attempt ends with the request's error.
		for ; done < len(as); done++ {
			_, errs[done] = as[done].finish(backend.Grant{}, start, err)
		}
		return errs[0]
	}
	if !errors.Is(err, ErrNotAcquired) {
		// The request's fate is unknown: its claims are tried no more
		// (see Client.wait).
		for i := range as {
			if as[i].req.Token, err = newToken(c.cfg.rand); err != nil {
				return err
			}
			as[i].h.token = as[i].req.Token
		}
	}
	return c.takeInOrder(s, as, locks, errs, &done)
}

// takeInOrder tries the set's begun attempts one at a time, in order, from
// done, until one fails.
func (c *Client) takeInOrder(s *LockSet, as []attempt, locks []*Lock, errs []error, done *int) (err error) {
	for ; err == nil && *done < len(as); *done++ {
		i := *done
		locks[i], errs[i] = as[i].finish(as[i].try())
		err = s.add(locks[i], errs[i])
	}
	return err
}

// giveBack releases the locks taken so far, after a failed acquisition.
func (s *LockSet) giveBack(ctx context.Context) error {
	var errs []error
	for _, l := range slices.Backward(s.locks) {
		if err := l.Release(ctx); err != nil && !errors.Is(err, ErrLost) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Names returns the set's names, in the order they were taken.
func (s *LockSet) Names() []string {
	names := make([]string, len(s.locks))
	for i, l := range s.locks {
		names[i] = l.Name()
	}
	return names
}

// Fence returns the fencing token of name's lock (see Lock.Fence), or 0
// when name is not in the set.
func (s *LockSet) Fence(name string) uint64 {
	i, ok := slices.BinarySearchFunc(s.locks, name, func(l *Lock, n string) int { return strings.Compare(l.Name(), n) })
	if !ok {
		return 0
	}
	return s.locks[i].Fence()
}

// Lost returns a channel that is closed as soon as any lock of the set is
// known lost (see Lock.Lost), by a Release that finds one gone too. It is
// not closed by Release.
func (s *LockSet) Lost() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost != nil {
		return s.lost
	}
	s.lost = make(chan struct{})
	if s.released {
		// No more watches: closed if a loss is known.
		if s.Err() != nil {
			close(s.lost)
		}
		return s.lost
	}
	for _, l := range s.locks {
		s.stops = append(s.stops, l.h.afterLost(func(error) { s.once.Do(func() { close(s.lost) }) }))
	}
	return s.lost
}

// Err returns nil while no lock of the set is known lost, then the first
// lost one's error, which names it.
func (s *LockSet) Err() error {
	for _, l := range s.locks {
		if err := l.Err(); err != nil {
			return err
		}
	}
	return nil
}

// TTL returns the shortest of the locks' TTLs (see Lock.TTL).
func (s *LockSet) TTL() time.Duration {
	var d time.Duration
	for _, l := range s.locks {
		if t := l.TTL(); d == 0 || t < d {
			d = t
		}
	}
	return d
}

// Deadline returns the earliest of the locks' deadlines (see
// Lock.Deadline).
func (s *LockSet) Deadline() time.Time {
	var d time.Time
	for _, l := range s.locks {
		if t := l.Deadline(); d.IsZero() || t.Before(d) {
			d = t
		}
	}
	return d
}

// Refresh refreshes every lock of the set, as Lock.Refresh does, and
// returns their errors joined.
func (s *LockSet) Refresh(ctx context.Context) error {
	var errs []error
	for _, l := range s.locks {
		errs = append(errs, l.Refresh(ctx))
	}
	return errors.Join(errs...)
}

// Release releases every lock of the set, in the reverse of the order they
// were taken, as Lock.Release does (it too outlives ctx), and returns their
// errors joined. A second Release returns one error wrapping ErrNotHeld.
func (s *LockSet) Release(ctx context.Context) error {
	if len(s.locks) > 0 && s.locks[0].released.Load() {
		return fmt.Errorf("locker: release lock set: %w: released already", ErrNotHeld)
	}
	// The watches end after the store's answers: a lock they find gone
	// closes Lost, as Lock.Release's does.
	defer s.unwatch()
	if len(s.locks) > 1 {
		if sa, ok := backend.As[backend.SetAcquirer](s.locks[0].h.c.drv); ok {
			return s.releaseAll(ctx, sa)
		}
	}
	var errs []error
	for _, l := range slices.Backward(s.locks) {
		errs = append(errs, l.Release(ctx))
	}
	return errors.Join(errs...)
}

// unwatch ends Lost's watches on the set's locks, for good.
func (s *LockSet) unwatch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = true
	for _, stop := range s.stops {
		stop()
	}
}

// releaseAll is Release with one request for the locks that the store
// must free (backend.SetAcquirer), each as Lock.Release would.
func (s *LockSet) releaseAll(ctx context.Context, sa backend.SetAcquirer) error {
	c := s.locks[0].h.c
	rctx, cancel := context.WithTimeout(outlive(ctx), releaseTimeout(s.TTL()))
	end, err := c.gate.Track(cancel)
	if err != nil {
		cancel()
		return fmt.Errorf("locker: release lock set: %w", err)
	}
	defer end()
	var errs, lost []error
	var due []*hold
	for _, l := range s.locks {
		if !l.released.CompareAndSwap(false, true) {
			errs = append(errs, fmt.Errorf("locker: release %q: %w: released already", l.h.name, ErrNotHeld))
			continue
		}
		gone, free, err := c.letGo(rctx, l.h)
		if !free {
			errs = append(errs, err)
			continue
		}
		due, lost = append(due, l.h), append(lost, gone)
	}
	if len(due) > 0 {
		claims := make([]backend.Claim, len(due))
		for i, h := range due {
			claims[i] = h.lock()
			c.releasing(objectOf(h.key, h.mode))
		}
		res := sa.ReleaseAll(rctx, claims)
		for i, h := range due {
			c.released(objectOf(h.key, h.mode))
			var err error
			if len(res) == len(claims) {
				err = res[i]
			} else {
				err = fmt.Errorf("the driver answered %d releases of %d", len(res), len(claims))
			}
			errs = append(errs, c.releaseResult(h, lost[i], err))
		}
	}
	err = errors.Join(errs...)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ErrNotHeld) {
		return fmt.Errorf("%w; the caller's context had ended: %w", err, context.Cause(ctx))
	}
	return err
}
