// Package history records what lock holders believe, with monotonic
// timestamps in one process, and checks it for the one thing a lock must
// never do: let two holders in at once without telling the first.
//
// A test records, for each attempt on a name, when the request is about to
// be sent ([Recorder.Begin]), when Acquire returned ([Holder.Acquired]),
// when the Lost signal fired ([Holder.Lost]), when release began and ended.
// [Recorder.Check] then reports overlaps and fences out of order.
//
// [CheckWrites] judges the other end: the writes a resource guarded by
// fences (package fenced) accepted.
package history

import (
	"sync"
	"time"
)

// Recorder collects the holders of a test. Its methods, and those of its
// holders, are safe for concurrent use and cheap: one mutex, no allocation
// beyond the holder.
type Recorder struct {
	start time.Time

	mu      sync.Mutex
	holders []*Holder
}

// New starts a recorder; report times are relative to now.
func New() *Recorder { return &Recorder{start: time.Now()} }

// Start is the time report times count from.
func (r *Recorder) Start() time.Time { return r.start }

// Holder is one attempt by one client on one name, and if it succeeded,
// the hold that followed. Zero times mean "did not happen".
type Holder struct {
	r *Recorder

	// Set once at Begin.
	ID     int           // order of Begin, from 1
	Name   string        // lock name
	Client string        // who: client and goroutine, for the report
	TTL    time.Duration // requested TTL, for the report and margins

	// Guarded by r.mu.
	begin, acquired, lost, releaseStart, released time.Time
	fence                                         uint64
	acquireErr, releaseErr                        error
}

// Begin records that client is about to send a request for name.
func (r *Recorder) Begin(name, client string, ttl time.Duration) *Holder {
	return r.BeginAt(time.Now(), name, client, ttl)
}

// BeginAt is Begin at a given time (for replaying or building histories).
func (r *Recorder) BeginAt(t time.Time, name, client string, ttl time.Duration) *Holder {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := &Holder{r: r, ID: len(r.holders) + 1, Name: name, Client: client, TTL: ttl, begin: t}
	r.holders = append(r.holders, h)
	return h
}

// Acquired records that Acquire returned a lock with fence (0: none).
func (h *Holder) Acquired(fence uint64) { h.AcquiredAt(time.Now(), fence) }

// AcquiredAt is Acquired at a given time.
func (h *Holder) AcquiredAt(t time.Time, fence uint64) {
	h.set(func() { h.acquired, h.fence = t, fence })
}

// Failed records that Acquire returned err: the client holds nothing.
func (h *Holder) Failed(err error) {
	h.set(func() { h.acquireErr = err })
}

// Lost records that the Lost signal fired now.
func (h *Holder) Lost() { h.LostAt(time.Now()) }

// LostAt is Lost at a given time. Only the first call counts.
func (h *Holder) LostAt(t time.Time) {
	h.set(func() {
		if h.lost.IsZero() {
			h.lost = t
		}
	})
}

// ReleaseStart records that the holder is about to call Release: from now
// on it no longer counts on the lock.
func (h *Holder) ReleaseStart() { h.ReleaseStartAt(time.Now()) }

// ReleaseStartAt is ReleaseStart at a given time.
func (h *Holder) ReleaseStartAt(t time.Time) {
	h.set(func() {
		if h.releaseStart.IsZero() {
			h.releaseStart = t
		}
	})
}

// Released records that Release returned err.
func (h *Holder) Released(err error) { h.ReleasedAt(time.Now(), err) }

// ReleasedAt is Released at a given time.
func (h *Holder) ReleasedAt(t time.Time, err error) {
	h.set(func() { h.released, h.releaseErr = t, err })
}

func (h *Holder) set(f func()) {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	f()
}

// Snapshot is a holder's record at one moment.
type Snapshot struct {
	ID                                            int
	Name, Client                                  string
	TTL                                           time.Duration
	Begin, Acquired, Lost, ReleaseStart, Released time.Time
	Fence                                         uint64
	AcquireErr, ReleaseErr                        error
}

// Held reports whether Acquire succeeded.
func (s Snapshot) Held() bool { return !s.Acquired.IsZero() }

// End is when the holder stopped believing it holds the lock: the earlier
// of release start and the lost signal; zero if it still believes so.
func (s Snapshot) End() time.Time {
	switch {
	case s.Lost.IsZero():
		return s.ReleaseStart
	case s.ReleaseStart.IsZero() || s.Lost.Before(s.ReleaseStart):
		return s.Lost
	default:
		return s.ReleaseStart
	}
}

// Holders returns a snapshot of every holder, in Begin order.
func (r *Recorder) Holders() []Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Snapshot, len(r.holders))
	for i, h := range r.holders {
		out[i] = Snapshot{
			ID: h.ID, Name: h.Name, Client: h.Client, TTL: h.TTL,
			Begin: h.begin, Acquired: h.acquired, Lost: h.lost,
			ReleaseStart: h.releaseStart, Released: h.released,
			Fence: h.fence, AcquireErr: h.acquireErr, ReleaseErr: h.releaseErr,
		}
	}
	return out
}
