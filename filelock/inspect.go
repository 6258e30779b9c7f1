package filelock

import (
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

// Inspect implements backend.Inspector: it reads the key's file under its
// flock, without changing it.
func (d *Driver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	var st backend.State
	err := d.update(ctx, key, false, func(r *record, now int64) (change, error) {
		st = d.state(key, r, now)
		return keep, nil
	})
	if errors.Is(err, errNoFile) {
		return backend.State{Key: key, Known: known}, nil
	}
	return st, err
}

// List implements backend.Lister: it reads every lock file of the
// directory, each under its flock, and keeps the held ones.
func (d *Driver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	if m != backend.Exclusive {
		return nil, backend.ErrUnsupported
	}
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
		base, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok || !e.Type().IsRegular() {
			continue // the fence counter's files, or not ours
		}
		st, err := d.listOne(ctx, base)
		if err != nil {
			return nil, err
		}
		if st.Held && strings.HasPrefix(st.Key, prefix) {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b backend.State) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// listOne reads the lock file base+".lock". Its key is the one the file
// records or, in a file of an older version, its name unescaped; a file
// that names no key (an older version's, with a shortened name, until its
// next write) is left out, as is one whose key does not give its name.
func (d *Driver) listOne(ctx context.Context, base string) (backend.State, error) {
	path := filepath.Join(d.dir, base+".lock")
	f, err := openLocked(ctx, path, false)
	if errors.Is(err, errNoFile) {
		return backend.State{}, nil // released meanwhile
	}
	if err != nil {
		return backend.State{}, err
	}
	defer f.Close()
	r, key, _, err := readFile(f.File, path)
	if err != nil {
		return backend.State{}, err
	}
	if key == "" && !strings.Contains(base, "~") {
		// EscapeKey escapes '~': only a shortened name has one.
		key, _ = url.PathUnescape(base)
	}
	if key == "" || d.Path(key) != path {
		return backend.State{}, nil
	}
	return d.state(key, &r, d.clk.now()), nil
}

// Break implements backend.Breaker: it frees the lock as a release does
// (see Operators in docs/backends/filelock.md) if its holder's fence is
// fence.
func (d *Driver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	if m != backend.Exclusive {
		return backend.State{}, backend.ErrUnsupported
	}
	var st backend.State
	var wake *os.File
	err := d.update(ctx, key, false, func(r *record, now int64) (what change, _ error) {
		if !d.live(r, now) || r.fence != fence {
			return keep, fmt.Errorf("filelock: %w", backend.ErrNotHeld)
		}
		st = d.state(key, r, now)
		what, wake = d.free(key, r, now)
		return what, nil
	})
	closeWake(wake)
	if err != nil {
		return backend.State{}, err
	}
	return st, nil
}
