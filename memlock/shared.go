package memlock

import (
	"context"
	"fmt"
	"time"

	"github.com/lockerhq/locker/backend"
)

// object names a semaphore or a read-write lock: a key's objects of
// different kinds are separate (backend.Modal).
type object struct {
	key  string
	kind backend.Mode // Permit, or Read for a read-write lock
}

func objectOf(c backend.Claim) object {
	if c.Mode == backend.Write {
		return object{c.Key, backend.Read}
	}
	return object{c.Key, c.Mode}
}

// shared is a semaphore's permits, or a read-write lock's readers and
// writer, with the writer that waits.
type shared struct {
	limit   int              // Permit: the holders' limit
	used    int              // Permit: the holders' weights together
	holders map[string]entry // by token
	writer  string           // the holder that writes, or ""
	waiting string           // the writer that waits, or ""
	until   time.Time        // when the waiting writer's record expires
}

// live drops expired holders and an expired waiting record, and forgets
// an object left empty.
func (s *Store) live(o object, now time.Time) *shared {
	sh := s.objects[o]
	if sh == nil {
		return nil
	}
	for t, e := range sh.holders {
		if !now.Before(e.expires) {
			sh.used -= e.weight
			delete(sh.holders, t)
			if t == sh.writer {
				sh.writer = ""
			}
		}
	}
	if sh.waiting != "" && !now.Before(sh.until) {
		sh.waiting = ""
	}
	if len(sh.holders) == 0 && sh.waiting == "" {
		delete(s.objects, o)
		return nil
	}
	return sh
}

// tryShared grants c when its mode's rule allows (see backend.Modal).
func (s *Store) tryShared(c backend.Claim, now time.Time) (backend.Grant, error) {
	o := objectOf(c)
	sh := s.live(o, now)
	if sh == nil {
		sh = &shared{holders: map[string]entry{}, limit: c.Limit}
	}
	switch c.Mode {
	case backend.Permit:
		limit := c.Limit
		// A token that holds already (a retry) is counted once, and
		// keeps its permits whatever the limit now.
		held := sh.holders[c.Token].weight
		if r := s.limits[c.Key]; r > 0 {
			if max(c.Weight, 1) > r && held == 0 {
				return backend.Grant{}, fmt.Errorf("memlock: %w", backend.ResizedTo(c.Weight, r))
			}
			limit = r
		} else if len(sh.holders) > 0 && sh.limit != c.Limit {
			return backend.Grant{}, fmt.Errorf("memlock: %w", backend.HeldUnder(sh.limit, c.Limit))
		}
		w := max(c.Weight, 1) - held
		if held == 0 && sh.used+w > limit {
			return backend.Grant{}, fmt.Errorf("memlock: %w", backend.ErrNotAcquired)
		}
		sh.limit = limit
		sh.used += w
	case backend.Read:
		if sh.writer != "" || sh.waiting != "" && sh.waiting != c.Token {
			return backend.Grant{}, fmt.Errorf("memlock: %w", backend.ErrNotAcquired)
		}
	case backend.Write:
		if len(sh.holders) > 0 {
			if sh.waiting == "" || sh.waiting == c.Token {
				sh.waiting, sh.until = c.Token, now.Add(c.TTL)
			}
			s.objects[o] = sh
			return backend.Grant{}, fmt.Errorf("memlock: %w", backend.ErrNotAcquired)
		}
		sh.writer = c.Token
		if sh.waiting == c.Token {
			sh.waiting = ""
		}
	}
	s.fence++
	e := entry{token: c.Token, owner: c.Owner, fence: s.fence, expires: now.Add(c.TTL)}
	if c.Mode == backend.Permit {
		e.weight = max(c.Weight, 1)
	}
	sh.holders[c.Token] = e
	s.objects[o] = sh
	return backend.Grant{Fence: s.fence, TTL: c.TTL}, nil
}

// refreshShared extends c's hold on its object.
func (s *Store) refreshShared(c backend.Claim, now time.Time) error {
	if sh := s.live(objectOf(c), now); sh != nil {
		if e, ok := sh.holders[c.Token]; ok {
			e.expires = now.Add(c.TTL)
			sh.holders[c.Token] = e
			return nil
		}
	}
	return fmt.Errorf("memlock: %w", backend.ErrNotHeld)
}

// releaseShared frees c's hold, or withdraws its waiting writer's record.
func (s *Store) releaseShared(c backend.Claim, now time.Time) error {
	o := objectOf(c)
	sh := s.live(o, now)
	if sh == nil {
		return fmt.Errorf("memlock: %w", backend.ErrNotHeld)
	}
	e, ok := sh.holders[c.Token]
	sh.used -= e.weight
	delete(sh.holders, c.Token)
	if sh.writer == c.Token {
		sh.writer = ""
	}
	if sh.waiting == c.Token {
		sh.waiting = ""
	}
	s.live(o, now) // forget it if empty
	s.notify(c.Key)
	if !ok {
		return fmt.Errorf("memlock: %w", backend.ErrNotHeld)
	}
	return nil
}

// Resize implements backend.Resizer.
func (d *Driver) Resize(ctx context.Context, key string, limit int) error {
	return d.locked(ctx, func(s *Store, now time.Time) error {
		if limit == 0 {
			delete(s.limits, key)
			return nil
		}
		s.limits[key] = limit
		if sh := s.live(object{key, backend.Permit}, now); sh != nil {
			sh.limit = limit
		}
		s.notify(key) // a higher limit may let waiters in
		return nil
	})
}
