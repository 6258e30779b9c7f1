package memlock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

// known is what a memlock entry records: everything but a queue, which
// memlock does not keep (waiters are notified, not queued).
const known = backend.KnowsOwner | backend.KnowsFence | backend.KnowsTTL

func (e entry) state(key string, now time.Time) backend.State {
	return backend.State{Key: key, Held: true, Owner: e.owner, Fence: e.fence, TTL: e.expires.Sub(now), Known: known}
}

// state describes o's live holders, by fence.
func (sh *shared) state(o object, now time.Time) backend.State {
	st := backend.State{Key: o.key, Mode: o.kind, Known: known.For(o.kind)}
	if o.kind == backend.Permit {
		st.Limit = sh.limit
	}
	for t, e := range sh.holders {
		h := backend.Holder{Mode: o.kind, Owner: e.owner, Fence: e.fence, TTL: e.expires.Sub(now), Weight: max(e.weight, 1)}
		if t == sh.writer {
			h.Mode = backend.Write
		}
		st.Holders = append(st.Holders, h)
	}
	st.Held = len(st.Holders) > 0
	return st
}

// Inspect implements backend.Inspector.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (st backend.State, err error) {
	err = d.locked(ctx, func(s *Store, now time.Time) error {
		if m = backend.Object(m); m != backend.Exclusive {
			o := object{key, m}
			if sh := s.live(o, now); sh != nil {
				st = sh.state(o, now)
				return nil
			}
		} else if e, ok := s.held(key, now); ok {
			st = e.state(key, now)
			return nil
		}
		st = backend.State{Key: key, Mode: m, Known: known.For(m)}
		if m == backend.Permit {
			st.Limit = s.limits[key]
		}
		return nil
	})
	return st, err
}

// List implements backend.Lister.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) (out []backend.State, err error) {
	err = d.locked(ctx, func(s *Store, now time.Time) error {
		if m = backend.Object(m); m != backend.Exclusive {
			for o := range s.objects {
				if o.kind != m || !strings.HasPrefix(o.key, prefix) {
					continue
				}
				if sh := s.live(o, now); sh != nil && len(sh.holders) > 0 {
					out = append(out, sh.state(o, now))
				}
			}
		} else {
			for key := range s.locks {
				if !strings.HasPrefix(key, prefix) {
					continue
				}
				if e, ok := s.held(key, now); ok {
					out = append(out, e.state(key, now))
				}
			}
		}
		return nil
	})
	return out, err
}

// Break implements backend.Breaker. Fences come from the store's one
// counter, so the next grant's is above the removed one's.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (st backend.State, err error) {
	err = d.locked(ctx, func(s *Store, now time.Time) error {
		if m = backend.Object(m); m == backend.Exclusive {
			e, ok := s.held(key, now)
			if !ok || e.fence != fence {
				return fmt.Errorf("memlock: %w", backend.ErrNotHeld)
			}
			delete(s.locks, key)
			s.notify(key)
			st = e.state(key, now)
			return nil
		}
		o := object{key, m}
		if sh := s.live(o, now); sh != nil {
			for t, e := range sh.holders {
				if e.fence == fence {
					st = sh.state(o, now)
					st.Holders = slices.DeleteFunc(st.Holders, func(h backend.Holder) bool { return h.Fence != fence })
					c := backend.Claim{Key: key, Token: t, Mode: m}
					if t == sh.writer {
						c.Mode = backend.Write
					}
					return s.releaseShared(c, now)
				}
			}
		}
		return fmt.Errorf("memlock: %w", backend.ErrNotHeld)
	})
	return st, err
}
