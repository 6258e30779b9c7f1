package election

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/lockerhq/locker"
)

// MaxValueLen is the longest value, in bytes, that every backend keeps
// whole as a lock's owner (filelock keeps 64 bytes, memcachelock 200).
const MaxValueLen = 64

var (
	// ErrInvalidValue: a candidate's value is empty, longer than
	// MaxValueLen bytes, not valid UTF-8 or contains NUL.
	ErrInvalidValue = errors.New("election: invalid value")
	// ErrCampaigning: a candidate with the same name and value campaigns
	// or leads through the same Client already (a lost term counts until
	// its release returns, at most 5 s). The Client's owner reentrancy
	// would make both leaders, so the second is refused.
	ErrCampaigning = errors.New("election: already campaigning")
	// ErrResigned is the cause of a Term's Context after Resign.
	ErrResigned = errors.New("election: resigned")
)

// DefaultPoll is the longest interval between two of Observe's reads.
const DefaultPoll = 250 * time.Millisecond

// Option configures an Election.
type Option func(*config)

type config struct {
	value   string
	valueOK bool
	ttl     time.Duration
	poll    time.Duration
}

// Value sets what this candidate advertises while it leads (an address, an
// ID): 1 to MaxValueLen bytes of valid UTF-8 without NUL. The default is a
// random 16-digit hex ID. Candidates of one election should have distinct
// values, so that Leader tells them apart.
func Value(v string) Option { return func(c *config) { c.value, c.valueOK = v, true } }

// TTL sets the lock's TTL (default: the Client's default TTL). A leader cut
// off from the store loses its term within it, and a new leader is granted
// after it.
func TTL(d time.Duration) Option { return func(c *config) { c.ttl = d } }

// PollEvery sets how often Observe reads the lock: by default DefaultPoll,
// or TTL/4 when the TTL option makes that smaller.
func PollEvery(d time.Duration) Option { return func(c *config) { c.poll = d } }

// Election is one candidate of the election called name. It is safe for
// concurrent use; a candidate leads at most one Term at a time.
type Election struct {
	c    *locker.Client
	name string
	cfg  config
}

// New returns the candidate of c in the election name (a lock name; see
// locker.CheckName). Invalid input returns a typed error (ErrInvalidValue,
// locker.ErrInvalidName, locker.ErrInvalidTTL) before any call to the
// store.
func New(c *locker.Client, name string, opts ...Option) (*Election, error) {
	if c == nil {
		return nil, fmt.Errorf("election: New: %w: nil Client", locker.ErrUnsupported)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if err := locker.CheckName(name); err != nil {
		return nil, fmt.Errorf("election: New: %w", err)
	}
	if cfg.valueOK {
		if err := checkValue(cfg.value); err != nil {
			return nil, err
		}
	} else {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("election: New: %w", err)
		}
		cfg.value = hex.EncodeToString(b[:])
	}
	if cfg.ttl != 0 {
		if err := locker.CheckTTL(cfg.ttl); err != nil {
			return nil, fmt.Errorf("election: New: %w", err)
		}
	}
	if cfg.poll < 0 {
		return nil, fmt.Errorf("election: New: %w: PollEvery %v", locker.ErrUnsupported, cfg.poll)
	}
	if cfg.poll == 0 {
		cfg.poll = DefaultPoll
		if cfg.ttl > 0 {
			cfg.poll = min(cfg.poll, cfg.ttl/4)
		}
	}
	return &Election{c: c, name: name, cfg: cfg}, nil
}

func checkValue(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: empty", ErrInvalidValue)
	case len(v) > MaxValueLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidValue, len(v), MaxValueLen)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidValue)
	case containsNUL(v):
		return fmt.Errorf("%w: contains NUL", ErrInvalidValue)
	}
	return nil
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

// Value returns what this candidate advertises.
func (e *Election) Value() string { return e.cfg.value }

// campaigns holds the candidates campaigning or leading, per Client, name
// and value: see ErrCampaigning.
var campaigns sync.Map // candidate -> struct{}

type candidate struct {
	c           *locker.Client
	name, value string
}

func (e *Election) key() candidate { return candidate{e.c, e.name, e.cfg.value} }

// Campaign waits until this candidate leads, and returns its Term; or
// returns an error when ctx ends (wrapping locker.ErrNotAcquired), the
// Client closes (locker.ErrClosed) or the store stays unreachable (see
// locker.Client.Acquire). ctx bounds the wait only: the Term lasts until
// Resign or the loss of the lock.
func (e *Election) Campaign(ctx context.Context) (*Term, error) {
	k := e.key()
	if _, dup := campaigns.LoadOrStore(k, struct{}{}); dup {
		return nil, fmt.Errorf("election: campaign %q as %q: %w", e.name, e.cfg.value, ErrCampaigning)
	}
	opts := []locker.LockOption{locker.Label(e.cfg.value), locker.Reentrant(e.cfg.value)}
	if e.cfg.ttl > 0 {
		opts = append(opts, locker.TTL(e.cfg.ttl))
	}
	l, err := e.c.Acquire(ctx, e.name, opts...)
	if err != nil {
		campaigns.Delete(k)
		return nil, fmt.Errorf("election: campaign %q: %w", e.name, err)
	}
	if l.Fence() == 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		_ = l.Release(rctx)
		campaigns.Delete(k)
		return nil, fmt.Errorf("election: campaign %q: %w: the backend issues no fencing tokens", e.name, locker.ErrUnsupported)
	}
	t := &Term{e: e, l: l}
	t.ctx, t.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	go t.watch()
	return t, nil
}

// releaseTimeout bounds the release of a term that nobody resigned.
const releaseTimeout = 5 * time.Second

// Term is one candidate's leadership, from Campaign to Resign or the loss
// of the lock.
type Term struct {
	e      *Election
	l      *locker.Lock
	ctx    context.Context
	cancel context.CancelCauseFunc

	once   sync.Once
	endErr error
}

// Context is cancelled the moment leadership is known lost or resigned;
// context.Cause says why (an error wrapping locker.ErrLost or
// locker.ErrClosed, or ErrResigned). Do the leader's work under it. It
// carries the values of Campaign's context.
func (t *Term) Context() context.Context { return t.ctx }

// Number is the term: the lock's fencing token, strictly greater than
// every earlier term's of this election. Pass it to storage, which rejects
// writes under a lower number than one it has seen.
func (t *Term) Number() uint64 { return t.l.Fence() }

// Value is what the leader advertises (the candidate's Value).
func (t *Term) Value() string { return t.e.cfg.value }

// Lock is the election's lock, for its Deadline or Err.
func (t *Term) Lock() *locker.Lock { return t.l }

// watch ends the term when the lock is lost. The Release that follows
// frees the owner in the Client (a lost hold stays there until released),
// so that the candidate can campaign again.
func (t *Term) watch() {
	select {
	case <-t.l.Lost():
		t.cancel(t.l.Err())
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		t.end(ctx)
	case <-t.ctx.Done(): // Resign
	}
}

// end releases the lock, once.
func (t *Term) end(ctx context.Context) error {
	t.once.Do(func() {
		err := t.l.Release(ctx)
		if err != nil && t.l.Err() == nil {
			t.endErr = fmt.Errorf("election: resign %q: %w", t.e.name, err)
		}
		campaigns.Delete(t.e.key())
	})
	return t.endErr
}

// Resign ends the term: its Context is cancelled first, then the lock is
// released, so that another candidate leads at once. It returns nil when
// the term had already been lost, and the release's error otherwise (the
// lock then expires after its TTL).
func (t *Term) Resign(ctx context.Context) error {
	t.cancel(ErrResigned)
	return t.end(ctx)
}
