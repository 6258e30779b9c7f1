package filelock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

// known is what a lock file records: owner (its first 64 bytes), fence
// and expiry; not its waiters.
const known = backend.KnowsOwner | backend.KnowsFence | backend.KnowsTTL

func (d *Driver) state(key string, r *record, now int64) backend.State {
	if !d.live(r, now) {
		return backend.State{Key: key, Known: known}
	}
	return backend.State{Key: key, Held: true, Owner: r.owner, Fence: r.fence, TTL: time.Duration(r.expires - now), Known: known}
}

// objectState describes the holders of o, key's object of mode m, as
// pruned at now, by fence: an object file records each holder's owner,
// fence and expiry, and a semaphore's limit.
func objectState(key string, m backend.Mode, o *object, now int64) backend.State {
	st := backend.State{Key: key, Mode: m, Held: len(o.holders) > 0, Known: known | backend.KnowsHolders}
	if m == backend.Permit {
		st.Known |= backend.KnowsLimit
		if st.Held {
			st.Limit = o.limit
		}
	}
	for _, h := range o.holders {
		st.Holders = append(st.Holders, backend.Holder{Mode: h.mode, Owner: h.owner, Fence: h.fence, TTL: time.Duration(h.expires - now), Weight: h.weight})
	}
	return st
}

// view reads the file at path of an object of mode m under its flock,
// without changing it, and prunes its expired entries: its state without
// the key, and the key it records. A missing file is a free object. For
// a semaphore's limitKey, the limit a Resize set is read under the same
// flock, which Resize holds while it writes both.
func (d *Driver) view(ctx context.Context, path string, m backend.Mode, limitKey string) (backend.State, string, error) {
	var r record
	var o object
	var key string
	limit := 0
	f, err := openLocked(ctx, path, false)
	switch {
	case errors.Is(err, errNoFile): // never taken, or released meanwhile
	case err != nil:
		return backend.State{}, "", err
	default:
		defer f.Close()
		if m == backend.Exclusive {
			r, key, _, err = readFile(f.File, path)
		} else {
			o, _, err = d.readObject(f.File, path)
			key = o.key
		}
		if err != nil {
			return backend.State{}, "", err
		}
	}
	if m == backend.Permit && limitKey != "" {
		if limit, err = d.readLimit(limitKey); err != nil {
			return backend.State{}, "", err
		}
	}
	now := d.clk.now()
	if m == backend.Exclusive {
		return d.state("", &r, now), key, nil
	}
	o.prune(now)
	st := objectState("", m, &o, now)
	st.Limit = cmp.Or(limit, st.Limit) // a resized one's, held or free
	return st, key, nil
}

// Inspect implements backend.Inspector: it reads the key's file (its
// lock's, semaphore's or read-write lock's) under its flock, without
// changing it.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	m = backend.Object(m)
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return backend.State{}, fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	st, _, err := d.view(ctx, d.objectPath(key, m), m, key)
	if err != nil {
		return backend.State{}, err
	}
	st.Key = key
	return st, nil
}

// List implements backend.Lister: it reads every file of the directory
// of an object of mode m, each under its flock, and keeps the held ones.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	m = backend.Object(m)
	ctx, leave, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	defer leave()
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	var out []backend.State
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), suffixOf(m))
		if !ok || !e.Type().IsRegular() {
			continue // another object's, the fence counter's, or not ours
		}
		st, err := d.listOne(ctx, base, m)
		if err != nil {
			return nil, err
		}
		if st.Held && strings.HasPrefix(st.Key, prefix) {
			out = append(out, st)
		}
	}
	return out, nil
}

// listOne reads the file of base's object of mode m. Its key is the one
// the file records or, in a file of an older version, its name unescaped;
// a file that names no key (an older version's, with a shortened name,
// until its next write) is left out, as is one whose key does not give
// its name.
func (d *Driver) listOne(ctx context.Context, base string, m backend.Mode) (backend.State, error) {
	path := filepath.Join(d.dir, base+suffixOf(m))
	st, key, err := d.view(ctx, path, m, "")
	if err != nil {
		return backend.State{}, err
	}
	if key == "" && !strings.Contains(base, "~") {
		// EscapeKey escapes '~': only a shortened name has one.
		key, _ = url.PathUnescape(base)
	}
	if key == "" || d.objectPath(key, m) != path {
		return backend.State{}, nil
	}
	st.Key = key
	return st, nil
}

// Break implements backend.Breaker: it frees the grant, as a release does
// (see Operators in docs/backends/filelock.md), if its fence is fence:
// the lock's holder, or one holder of the semaphore or read-write lock.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	notHeld := fmt.Errorf("filelock: %w", backend.ErrNotHeld)
	var st backend.State
	var err error
	if m = backend.Object(m); m != backend.Exclusive {
		err = d.updateObject(ctx, backend.Claim{Key: key, Mode: m}, false, func(o *object, now int64) (bool, error) {
			i := slices.IndexFunc(o.holders, func(h holder) bool { return h.fence == fence })
			if i < 0 {
				return false, notHeld
			}
			st = objectState(key, m, &object{limit: o.limit, holders: o.holders[i : i+1]}, now)
			o.holders = slices.Delete(o.holders, i, i+1)
			return true, nil
		})
	} else {
		var wake *os.File
		err = d.update(ctx, key, false, func(r *record, now int64) (what change, _ error) {
			if !d.live(r, now) || r.fence != fence {
				return keep, notHeld
			}
			st = d.state(key, r, now)
			what, wake = d.free(key, r, now)
			return what, nil
		})
		wake.Close() // see next
	}
	if err != nil {
		return backend.State{}, err
	}
	return st, nil
}
