package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/memlock"
)

// The suite must be able to fail. Each variant below breaks the in-memory
// backend in one way a real driver might, and names the cases that must
// catch it. TestSuiteCatchesBrokenBackends runs each variant's cases in a
// child process and checks that every one of them fails, and that every
// case of the suite catches at least one variant.
var brokenVariants = map[string][]string{
	// Release deletes whatever holds the key: no token check.
	"release-ignores-token": {"ForgedTokenChangesNothing", "DoubleReleaseNotHeld", "OldHolderCannotTouchNewHolder", "SemaphoreForgedTokenChangesNothing", "RWForgedTokenChangesNothing"},
	// Refresh reports success without checking or extending anything.
	"refresh-always-ok": {"LockSetLost", "LostSignalFires", "DoCancelsOnLoss", "ReentryAfterLossFails", "RefreshExtends", "WatchdogKeepsLock", "ReentryExtendsTTL", "ForgedTokenChangesNothing"},
	// The TTL is ignored: locks never expire.
	"never-expires": {"ExpiresAfterTTL", "OldHolderCannotTouchNewHolder", "FencesIncreaseAcrossExpiry", "SemaphoreCutHolderLosesFirst", "RWCutHolderLosesFirst"},
	// Locks expire at half their TTL.
	"expires-early": {"LockDelayAfterLoss", "ExpiresAfterTTL", "LostBeforeTakeover", "RefreshExtends", "ReentryExtendsTTL", "SemaphoreCutHolderLosesFirst", "RWCutHolderLosesFirst"},
	// Locks expire at 95% of their TTL: too little for ExpiresAfterTTL to
	// see, enough for two holders at once.
	"expires-slightly-early": {"LostBeforeTakeover"},
	// TryAcquire takes over a held lock.
	"no-exclusion": {"LockSetAllOrNothing", "LockSetCrossedOrders", "SecondAcquirerRefused", "ConcurrentTryAcquireOneWinner", "CounterUnderContention", "ReentrantThreeDeep", "WatchdogKeepsLock"},
	// Keys lose the characters a naive encoder drops, so names collide.
	"lossy-keys": {"IndependentNames", "AnyValidNameWorks"},
	// A set refused for one held name keeps the others it took.
	"set-keeps-part": {"LockSetAllOrNothing"},
	// A set's one request fails, as a store error, for more names than
	// the store takes in one request (etcd's 128 operations).
	"set-size-limit": {"LockSetManyNames"},
	// A set's release stops at a claim not held, and leaves the claims
	// after it held (a statement that fails whole, not followed by each
	// claim's release).
	"release-all-stops-at-gone": {"LockSetOneGone"},
	// Release reports success but leaves the lock held for an hour.
	"release-keeps-lock": {"ReacquireAfterRelease", "WaiterWakesAfterRelease", "SemaphoreWaiterWakes", "RWWaitersWake", "ReleaseAfterCancelFreesName", "LockSetAllOrNothing"},
	// The store takes a claim that carries the holder's label for the
	// holder, and lets it in: a label made the reentrancy key.
	"label-reenters": {"SharedLabelExcludes"},
	// TryAcquire on a held lock ignores its context for seconds.
	"ignores-context": {"CancelReturnsPromptly"},
	// A TryAcquire whose caller gives up while its request is on the wire
	// returns at once, and the request lands later: after the Client's
	// release of what the call may have left, which overtakes it.
	"lands-late": {"CancelledAcquireLeavesNameFree", "LockSetCancelledLeavesNamesFree"},
	// A TryAcquire that failed for want of the store is sent again by the
	// driver once the network is back (a client library's retry on
	// reconnect): the name is taken after its caller was told it failed,
	// by nobody who will release it.
	"ghost-grant": {"LockSetServerFailsMidway"},
	// The same in a native queue: an entry whose request failed is sent
	// again once the network is back (only a blocking set's wait queues).
	"queue-ghost-grant": {"LockSetServerFailsMidway"},
	// A native queue that forgets to remove a cancelled waiter's entry.
	"queue-leaks-entry": {"CancelLeavesNoEntry", "SemaphoreCancelLeavesNoEntry"},
	// A native queue that claims FIFO but serves the newest waiter first.
	"lifo-queue": {"FIFOWaiters", "SemaphoreFIFOWaiters"},
	// A native queue whose grants date from the waiter's joining, so a
	// lock that was waited for longer than its TTL looks expired at once.
	"queue-dates-grant-at-join": {"LongWaitKeepsLock"},
	// Each client counts fences on its own, not in the store.
	"per-client-fences": {"FencesIncrease", "FencesIncreaseAcrossExpiry", "SemaphoreFencesIncrease", "RWFencesIncrease"},
	// TTLs go through int32 milliseconds: 1ns becomes 0 ("no expiry"), 30
	// days overflows.
	"int32-millis": {"BadInputTypedErrors"},
	// A native queue that reports a failure to reach the store as a
	// refusal that no retry can cure.
	"queue-fails-fast": {"WaitRidesOutStoreOutage"},
	// A native queue that, cut off from its store, claims to have looked.
	"queue-ignores-budget": {"WaitGivesUpAfterFailureBudget"},
	// Release leaves the name's entry behind (expired) for good.
	"remembers-names": {"ForgetsReleasedNames"},
	// Fences are counted per name, and the count goes with the name.
	"forgets-fences": {"ForgetsReleasedNames", "FencesIncrease", "ForceReleaseFencesAndSignals"},
	// Inspect answers from a cache of the first state it read for a key.
	"inspect-stale": {"InspectReportsHolderAndQueue"},
	// A native queue whose Inspect counts the holder among the waiters.
	"miscounted-queue": {"InspectReportsHolderAndQueue"},
	// List returns every held key, whatever the prefix.
	"list-ignores-prefix": {"ListFindsHeldLocks"},
	// Break removes whoever holds the key, whatever the fence.
	"break-ignores-fence": {"ForceReleaseFencesAndSignals"},
	// Resize answers as if it kept the limit, and keeps nothing.
	"resize-ignored": {"SemaphoreResized"},
	// Break of one permit, reader or writer frees every holder of the
	// object.
	"break-frees-every-holder": {"SemaphoreHoldersSeenAndBroken", "RWHoldersSeenAndBroken"},
	// Refresh of a key found free takes it again, so a holder removed by
	// Break never learns of it (and holds the lock with its successor).
	"refresh-retakes-free": {"ForceReleaseFencesAndSignals"},
	// Refresh never shortens a lock: it keeps the later of the old expiry
	// and the new TTL.
	"refresh-only-extends": {"MinHoldOutlivesRelease"},
	// A semaphore grants one permit more than its limit.
	"sem-over-grants": {"SemaphoreAtMostLimit", "SemaphoreLimitAndMismatch"},
	// A claim of n permits is counted as one.
	"weight-ignored": {"SemaphoreWeightsAtMostLimit", "SemaphoreWeightsRefused"},
	// A claim of n permits is counted as n+1.
	"weight-overcounts": {"SemaphoreWeightsAtMostLimit", "SemaphoreWeightsRefused"},
	// A native queue that lets in any waiter whose claim fits, ahead of
	// a heavier one that waits longer.
	"overtaking-queue": {"SemaphoreWeightsFIFO"},
	// Claims under another limit wait like any other instead of failing.
	"hides-limit-mismatch": {"SemaphoreLimitAndMismatch"},
	// A writer takes the read side: it shares with readers.
	"rw-writer-with-readers": {"RWReadersShareWriterExcludes", "RWCounterUnderContention", "RWWaitersWake"},
	// Readers keep entering while a writer waits.
	"rw-starves-writers": {"RWWriterNotStarved"},
	// A writer that stops trying leaves its record of waiting behind.
	"keeps-writer-record": {"RWCancelledWriterLeavesNothing"},
	// Subscribe succeeds but never reports a release.
	"silent-watch": {"WatchReportsEveryRelease"},
	// Goroutines outlive Close and cancelled subscriptions.
	"leaks-goroutines": {"CloseReleasesAndLeavesNoGoroutine", "CancelledWaitLeavesNoGoroutine", "WatchReportsEveryRelease"},
}

// Controls: the same wrapper, unbroken, must pass every case it runs.
var controlVariants = []string{"none", "fifo-queue"}

const variantEnv = "LOCKER_CONFORMANCE_BROKEN"

func TestSuiteCatchesBrokenBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite in child processes")
	}
	caught := map[string]bool{}
	for _, want := range brokenVariants {
		for _, c := range want {
			caught[c] = true
		}
	}
	for _, c := range cases {
		if !caught[c.name] {
			t.Errorf("case %s catches none of the broken variants: show that it can fail", c.name)
		}
	}
	for variant, want := range brokenVariants {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			out, err := runChild(t, variant, want)
			if err == nil {
				t.Fatalf("the suite passed a backend broken as %q\n%s", variant, out)
			}
			for _, c := range want {
				if !regexp.MustCompile(`--- FAIL: TestBrokenChild/(Serial|Parallel)/` + c + ` `).MatchString(out) {
					t.Errorf("case %s did not catch %q", c, variant)
				}
			}
			if t.Failed() {
				t.Logf("child output:\n%s", out)
			}
		})
	}
	for _, variant := range controlVariants {
		t.Run("control-"+variant, func(t *testing.T) {
			t.Parallel()
			if out, err := runChild(t, variant, nil); err != nil || strings.Contains(out, "--- FAIL") {
				t.Fatalf("the unbroken wrapper %q failed the suite: %v\n%s", variant, err, out)
			}
		})
	}
}

// runChild runs the named cases (all when nil) against a variant in a
// child process of this test binary.
func runChild(t *testing.T, variant string, only []string) (string, error) {
	run := "^TestBrokenChild$"
	if only != nil {
		run += "/^(Serial|Parallel)$/^(" + strings.Join(only, "|") + ")$"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), variantEnv+"="+variant)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("child for %q timed out:\n%s", variant, out)
	}
	return string(out), err
}

// TestBrokenChild is the child side of TestSuiteCatchesBrokenBackends.
func TestBrokenChild(t *testing.T) {
	variant := os.Getenv(variantEnv)
	if variant == "" {
		t.Log("nothing to do: TestSuiteCatchesBrokenBackends runs this in a child process")
		return
	}
	Run(t, newBrokenHarness(variant))
}

// brokenHarness wraps one memlock store; its drivers share the state that
// their breakage needs.
type brokenHarness struct {
	variant string
	store   *memlock.Store
	mu      sync.Mutex
	queues  map[string][]string      // native-queue variants: waiting tokens per key
	holders map[string]string        // native-queue variants: who holds each key
	fences  map[string]uint64        // forgets-fences: the count per name
	seen    map[string]backend.State // inspect-stale: the first state read
	granted map[string][]string      // tokens holding each semaphore or read-write lock
	kept    map[string]bool          // release-keeps-lock: tokens whose release kept the lock
	flying  map[string]backend.Claim // lands-late: acquisitions on the wire, by token
	keepMu  sync.Mutex               // release-keeps-lock: orders refreshes with the release's
	rwMu    sync.RWMutex             // rw-starves-writers: a write's try and its withdrawal are one step
}

func newBrokenHarness(variant string) Harness {
	h := &brokenHarness{
		variant: variant,
		store:   memlock.NewStore(),
		queues:  map[string][]string{},
		holders: map[string]string{},
		fences:  map[string]uint64{},
		seen:    map[string]backend.State{},
		granted: map[string][]string{},
		kept:    map[string]bool{},
		flying:  map[string]backend.Claim{},
	}
	if h.queued() {
		return queueHarness{h}
	}
	return h
}

func (h *brokenHarness) queued() bool {
	return strings.HasSuffix(h.variant, "queue") || strings.HasPrefix(h.variant, "queue-")
}

// queueHarness lets the suite count the native queue's entries.
type queueHarness struct{ *brokenHarness }

func (h *brokenHarness) NewDriver(ctx context.Context) (backend.Driver, error) {
	drv, _, err := h.NewCutDriver(ctx)
	return drv, err
}

// NewCutDriver implements Outager: a driver that is down fails every call
// as a store out of reach would.
func (h *brokenHarness) NewCutDriver(context.Context) (backend.Driver, func(bool), error) {
	mem, err := memlock.New(h.store)
	if err != nil {
		return nil, nil, err
	}
	d := &brokenDriver{Driver: mem, h: h, fences: map[string]uint64{}}
	drv, err := h.wrap(d)
	return drv, d.setDown, err
}

// Residue implements ResidueCounter.
func (h *brokenHarness) Residue(_ context.Context, key string) (int, error) {
	if h.store.Keeps(h.mapKey(key)) {
		return 1, nil
	}
	return 0, nil
}

func (h *brokenHarness) wrap(d *brokenDriver) (backend.Driver, error) {
	if h.variant == "leaks-goroutines" {
		go func() { select {} }()
	}
	if h.queued() {
		return &queueDriver{d}, nil
	}
	return d, nil
}

func (h *brokenHarness) Expire(_ context.Context, key string) error {
	if !h.store.Expire(h.mapKey(key)) {
		return fmt.Errorf("no lock on %q", key)
	}
	return nil
}

func (h *brokenHarness) Traits() Traits {
	tr := Traits{TTL: 300 * time.Millisecond}
	if strings.HasSuffix(h.variant, "queue") {
		tr.FIFO = backend.Modes(backend.Exclusive, backend.Permit)
	}
	return tr
}

// Entries counts waiters and the holder, for the native-queue variants.
func (h queueHarness) Entries(_ context.Context, key string) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.queues[key])
	if h.holders[key] != "" {
		n++
	}
	return n, nil
}

var nonAlnum = regexp.MustCompile(`[^A-Za-z0-9]`)

func (h *brokenHarness) mapKey(key string) string {
	if h.variant == "lossy-keys" {
		return nonAlnum.ReplaceAllString(key, "")
	}
	return key
}

type brokenDriver struct {
	*memlock.Driver
	h      *brokenHarness
	down   atomic.Bool // cut off from the store
	mu     sync.Mutex
	fences map[string]uint64 // per-client-fences
	ghosts []backend.Claim   // ghost-grant: tries to send again once up
}

// setDown cuts the driver off from the store, or lets it through again.
func (d *brokenDriver) setDown(down bool) {
	d.down.Store(down)
	d.mu.Lock()
	ghosts := d.ghosts
	if !down {
		d.ghosts = nil
	}
	d.mu.Unlock()
	for _, l := range ghosts {
		if !down {
			d.Driver.TryAcquire(context.Background(), l)
		}
	}
}

// errUnreachable is what a driver that is down returns.
var errUnreachable = errors.New("broken: store unreachable")

func (d *brokenDriver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	want := l.TTL
	l.Key = d.h.mapKey(l.Key)
	l = d.h.modeOf(l)
	if d.down.Load() {
		if d.h.variant == "ghost-grant" {
			d.mu.Lock()
			d.ghosts = append(d.ghosts, l)
			d.mu.Unlock()
		}
		return backend.Grant{}, errUnreachable
	}
	switch d.h.variant {
	case "never-expires":
		l.TTL = time.Hour
	case "expires-early":
		l.TTL /= 2
	case "expires-slightly-early":
		l.TTL = l.TTL * 95 / 100
	case "int32-millis":
		switch ms := int32(l.TTL.Milliseconds()); {
		case ms == 0:
			l.TTL = time.Hour // as memcached reads 0: no expiry
		case ms < 0:
			l.TTL = time.Nanosecond
		default:
			l.TTL = time.Duration(ms) * time.Millisecond
		}
	}
	if d.h.variant == "lands-late" && ctx.Err() == nil {
		t := time.NewTimer(landsLateFlight)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			d.fly(l)
			return backend.Grant{}, ctx.Err()
		}
	}
	if d.h.variant == "rw-starves-writers" {
		// No reader ever sees the waiting writer's record that the
		// store makes and the variant withdraws.
		if l.Mode == backend.Write {
			d.h.rwMu.Lock()
			defer d.h.rwMu.Unlock()
		} else {
			d.h.rwMu.RLock()
			defer d.h.rwMu.RUnlock()
		}
	}
	g, err := d.Driver.TryAcquire(ctx, l)
	switch {
	case err == nil:
		d.h.grant(l, true)
	case l.Mode == backend.Write && d.h.variant == "rw-starves-writers":
		d.Driver.Release(ctx, l) // no record of the waiting writer
	case errors.Is(err, backend.ErrLimitMismatch) && d.h.variant == "hides-limit-mismatch":
		err = fmt.Errorf("broken: %w", backend.ErrNotAcquired)
	case d.h.variant == "no-exclusion":
		d.h.store.Expire(l.Key)
		g, err = d.Driver.TryAcquire(ctx, l)
	case d.h.variant == "label-reenters" && l.Mode == backend.Exclusive:
		if st, ierr := d.Driver.Inspect(ctx, l.Key, backend.Exclusive); ierr == nil && st.Held && st.Owner == l.Owner {
			d.h.store.Expire(l.Key)
			g, err = d.Driver.TryAcquire(ctx, l)
		}
	case d.h.variant == "ignores-context":
		time.Sleep(3 * time.Second)
	}
	if err != nil {
		return g, err
	}
	g.TTL = want
	switch d.h.variant {
	case "per-client-fences":
		d.mu.Lock()
		d.fences[l.Key]++
		g.Fence = d.fences[l.Key]
		d.mu.Unlock()
	case "forgets-fences":
		d.h.mu.Lock()
		d.h.fences[l.Key]++
		g.Fence = d.h.fences[l.Key]
		d.h.mu.Unlock()
	}
	return g, nil
}

func (d *brokenDriver) Refresh(ctx context.Context, l backend.Claim) error {
	if d.down.Load() {
		return errUnreachable
	}
	l.Key = d.h.mapKey(l.Key)
	l = d.h.modeOf(l)
	switch d.h.variant {
	case "refresh-always-ok":
		return nil
	case "release-keeps-lock":
		// A watchdog refresh still in flight at the release must not
		// shorten the kept lock again: it runs wholly before the
		// release's refresh or after it (keepMu), and then sees kept.
		d.h.keepMu.Lock()
		defer d.h.keepMu.Unlock()
		d.h.mu.Lock()
		if d.h.kept[l.Token] {
			l.TTL = time.Hour
		}
		d.h.mu.Unlock()
	case "expires-early":
		l.TTL /= 2
	case "refresh-only-extends":
		if st, err := d.Driver.Inspect(ctx, l.Key, backend.Exclusive); err == nil && st.Held && st.TTL > l.TTL {
			l.TTL = st.TTL
		}
	case "refresh-retakes-free":
		if err := d.Driver.Refresh(ctx, l); !errors.Is(err, backend.ErrNotHeld) {
			return err
		}
		_, err := d.Driver.TryAcquire(ctx, l)
		return err
	}
	return d.Driver.Refresh(ctx, l)
}

// RefreshMany goes through Refresh, so that every variant's refresh
// (release-keeps-lock's ordering with the release, lossy keys, modes)
// applies to the watchdog's batches too: the embedded driver's own batch
// call would bypass it.
func (d *brokenDriver) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	errs := make([]error, len(locks))
	for i, l := range locks {
		errs[i] = d.Refresh(ctx, l)
	}
	return errs
}

// setSizeLimit is set-size-limit's most claims in one request.
const setSizeLimit = 64

var errTooManyOps = errors.New("too many operations in one request")

// TryAcquireAll takes the claims one by one through the variant's
// TryAcquire, and gives back what it took when one is refused, unless
// the variant keeps it.
func (d *brokenDriver) TryAcquireAll(ctx context.Context, claims []backend.Claim) ([]backend.Grant, error) {
	if d.h.variant == "set-size-limit" && len(claims) > setSizeLimit {
		return nil, errTooManyOps
	}
	grants := make([]backend.Grant, 0, len(claims))
	for i, l := range claims {
		g, err := d.TryAcquire(ctx, l)
		if err != nil {
			if d.h.variant != "set-keeps-part" {
				// Not on ctx: a try that failed as ctx ended undoes
				// what it took all the same.
				d.ReleaseAll(context.WithoutCancel(ctx), claims[:i])
			}
			return nil, err
		}
		grants = append(grants, g)
	}
	return grants, nil
}

func (d *brokenDriver) ReleaseAll(ctx context.Context, claims []backend.Claim) []error {
	errs := make([]error, len(claims))
	if d.h.variant == "set-size-limit" && len(claims) > setSizeLimit {
		for i := range errs {
			errs[i] = errTooManyOps
		}
		return errs
	}
	for i, l := range claims {
		errs[i] = d.Release(ctx, l)
		if d.h.variant == "release-all-stops-at-gone" && errors.Is(errs[i], backend.ErrNotHeld) {
			for j := i + 1; j < len(claims); j++ {
				errs[j] = errs[i]
			}
			break
		}
	}
	return errs
}

func (d *brokenDriver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	st, err := d.Driver.Inspect(ctx, d.h.mapKey(key), m)
	st.Key = key
	if err == nil && d.h.variant == "inspect-stale" {
		d.h.mu.Lock()
		defer d.h.mu.Unlock()
		if old, ok := d.h.seen[key]; ok && old.Held {
			return old, nil
		}
		d.h.seen[key] = st
	}
	return st, err
}

func (d *brokenDriver) List(ctx context.Context, prefix string, m backend.Mode) ([]backend.State, error) {
	if d.h.variant == "list-ignores-prefix" {
		prefix = ""
	}
	return d.Driver.List(ctx, prefix, m)
}

func (d *brokenDriver) Resize(ctx context.Context, key string, limit int) error {
	if d.h.variant == "resize-ignored" {
		return nil
	}
	return d.Driver.Resize(ctx, d.h.mapKey(key), limit)
}

func (d *brokenDriver) Break(ctx context.Context, key string, m backend.Mode, fence uint64) (backend.State, error) {
	key = d.h.mapKey(key)
	switch d.h.variant {
	case "break-ignores-fence":
		if st, err := d.Driver.Inspect(ctx, key, m); err == nil && st.Held {
			fence = st.Fence
		}
	case "forgets-fences":
		d.h.mu.Lock()
		delete(d.h.fences, key)
		d.h.mu.Unlock()
	case "break-frees-every-holder":
		if st, err := d.Driver.Inspect(ctx, key, m); err == nil {
			for _, h := range st.Holders {
				if h.Fence != fence {
					d.Driver.Break(ctx, key, m, h.Fence)
				}
			}
		}
	}
	return d.Driver.Break(ctx, key, m, fence)
}

func (d *brokenDriver) Release(ctx context.Context, l backend.Claim) error {
	if d.down.Load() {
		return errUnreachable
	}
	l.Key = d.h.mapKey(l.Key)
	l = d.h.modeOf(l)
	if l.Mode != backend.Exclusive {
		held := d.h.grant(l, false)
		switch {
		case held:
		case d.h.variant == "keeps-writer-record" && l.Mode == backend.Write:
			return fmt.Errorf("broken: %w", backend.ErrNotHeld)
		case d.h.variant == "release-ignores-token":
			if other := d.h.anyHolder(l); other != "" {
				l.Token = other
				d.h.grant(l, false)
			}
		}
	}
	switch d.h.variant {
	case "remembers-names":
		l.TTL = time.Nanosecond // expired at once, and kept
		return d.Driver.Refresh(ctx, l)
	case "forgets-fences":
		d.h.mu.Lock()
		delete(d.h.fences, l.Key)
		d.h.mu.Unlock()
	case "release-ignores-token":
		if !d.h.store.Expire(l.Key) {
			return fmt.Errorf("broken: %w", backend.ErrNotHeld)
		}
		return nil
	case "release-keeps-lock":
		d.h.keepMu.Lock()
		defer d.h.keepMu.Unlock()
		d.h.mu.Lock()
		d.h.kept[l.Token] = true
		d.h.mu.Unlock()
		l.TTL = time.Hour
		d.Driver.Refresh(ctx, l)
		return nil
	case "lands-late":
		err := d.Driver.Release(ctx, l)
		d.land(l.Token) // the request on the wire, overtaken
		return err
	}
	return d.Driver.Release(ctx, l)
}

// landsLateFlight is how long a lands-late request is on the wire; it
// lands at most landsLateLater after its caller gave up.
const (
	landsLateFlight = time.Millisecond
	landsLateLater  = 5 * time.Millisecond
)

// fly puts l's acquisition on the wire: it lands at the next Release for
// its token, after that release, or landsLateLater from now.
func (d *brokenDriver) fly(l backend.Claim) {
	d.h.mu.Lock()
	d.h.flying[l.Token] = l
	d.h.mu.Unlock()
	time.AfterFunc(landsLateLater, func() { d.land(l.Token) })
}

// land applies the acquisition of token still on the wire, if any.
func (d *brokenDriver) land(token string) {
	d.h.mu.Lock()
	l, ok := d.h.flying[token]
	delete(d.h.flying, token)
	d.h.mu.Unlock()
	if ok {
		d.Driver.TryAcquire(context.Background(), l)
	}
}

func (d *brokenDriver) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if d.down.Load() {
		return nil, nil, errUnreachable
	}
	ch, cancel, err := d.Driver.Subscribe(ctx, d.h.mapKey(key))
	if err == nil && d.h.variant == "leaks-goroutines" {
		go func() { select {} }()
	}
	if err == nil && d.h.variant == "silent-watch" {
		ch = make(chan struct{})
	}
	return ch, cancel, err
}

// queueDriver adds a native queue (backend.Queuer): waiters take turns by
// their place in it.
type queueDriver struct{ *brokenDriver }

var _ backend.Queuer = (*queueDriver)(nil)

func (d *queueDriver) QueueModes() backend.ModeSet {
	return backend.Modes(backend.Exclusive, backend.Permit, backend.Read, backend.Write)
}

func (d *queueDriver) Enqueue(ctx context.Context, l backend.Claim) (backend.Grant, backend.Ticket, error) {
	if d.down.Load() {
		if d.h.variant == "queue-ghost-grant" {
			d.mu.Lock()
			d.ghosts = append(d.ghosts, l)
			d.mu.Unlock()
		}
		return backend.Grant{}, nil, errUnreachable
	}
	h := d.h
	h.mu.Lock()
	h.queues[l.Key] = append(h.queues[l.Key], l.Token)
	h.mu.Unlock()
	t := &queueTicket{d: d, l: l, joined: time.Now()}
	g, err := t.look(ctx)
	switch {
	case err == nil:
		return g, nil, nil
	case errors.Is(err, backend.ErrNotAcquired):
		return backend.Grant{}, t, nil
	}
	t.dequeue()
	return backend.Grant{}, nil, err
}

// queueTicket is a waiter's place in a queueDriver's queue.
type queueTicket struct {
	d      *queueDriver
	l      backend.Claim
	joined time.Time
}

func (t *queueTicket) dequeue() {
	h := t.d.h
	h.mu.Lock()
	h.queues[t.l.Key] = slices.DeleteFunc(h.queues[t.l.Key], func(x string) bool { return x == t.l.Token })
	h.mu.Unlock()
}

// look takes the lock if the ticket is next.
func (t *queueTicket) look(ctx context.Context) (backend.Grant, error) {
	h, d := t.d.h, t.d
	h.mu.Lock()
	q := h.queues[t.l.Key]
	next := q[0]
	if h.variant == "lifo-queue" {
		next = q[len(q)-1]
	}
	h.mu.Unlock()
	sent := time.Now()
	err := fmt.Errorf("broken: %w", backend.ErrNotAcquired)
	if next == t.l.Token || h.variant == "overtaking-queue" {
		var g backend.Grant
		if g, err = d.TryAcquire(ctx, t.l); err == nil {
			t.dequeue()
			g.Sent = sent
			if h.variant == "queue-dates-grant-at-join" {
				g.Sent = t.joined
			}
			return g, nil
		}
	}
	if d.down.Load() {
		switch h.variant {
		case "queue-ignores-budget":
			// Claims to have looked while the store is out of reach.
			err = fmt.Errorf("broken: %w", backend.ErrNotAcquired)
		case "queue-fails-fast":
			err = fmt.Errorf("%w: %w", backend.ErrPermission, errUnreachable)
		default:
			err = errUnreachable // a real queue would lose its watch
		}
	}
	return backend.Grant{}, err
}

func (t *queueTicket) Wait(ctx context.Context) (backend.Grant, error) {
	select {
	case <-ctx.Done():
		return backend.Grant{}, ctx.Err()
	case <-time.After(2 * time.Millisecond):
	}
	return t.look(ctx)
}

func (t *queueTicket) Leave(ctx context.Context) error {
	if t.d.h.variant != "queue-leaks-entry" {
		t.dequeue()
	}
	err := t.d.Release(ctx, t.l)
	if errors.Is(err, backend.ErrNotHeld) {
		return nil
	}
	return err
}

// Inspect adds the queue's length: the waiters behind the holder.
func (d *queueDriver) Inspect(ctx context.Context, key string, m backend.Mode) (backend.State, error) {
	st, err := d.brokenDriver.Inspect(ctx, key, m)
	d.h.mu.Lock()
	st.Waiters = len(d.h.queues[d.h.mapKey(key)])
	d.h.mu.Unlock()
	if d.h.variant == "miscounted-queue" && st.Held {
		st.Waiters++
	}
	st.Known |= backend.KnowsWaiters
	return st, err
}

func (d *queueDriver) TryAcquire(ctx context.Context, l backend.Claim) (backend.Grant, error) {
	g, err := d.brokenDriver.TryAcquire(ctx, l)
	if errors.Is(err, backend.ErrNotAcquired) && l.Mode == backend.Write {
		// A queue orders writers itself: memlock's record of a waiting
		// writer is not for a Waiter (backend.Modal).
		d.brokenDriver.Release(ctx, l)
	}
	if err == nil {
		d.h.mu.Lock()
		d.h.holders[l.Key] = l.Token
		d.h.mu.Unlock()
	}
	return g, err
}

func (d *queueDriver) Release(ctx context.Context, l backend.Claim) error {
	d.h.mu.Lock()
	if d.h.holders[l.Key] == l.Token {
		delete(d.h.holders, l.Key)
	}
	d.h.mu.Unlock()
	return d.brokenDriver.Release(ctx, l)
}

// modeOf is the mode a variant really takes for l.
func (h *brokenHarness) modeOf(l backend.Claim) backend.Claim {
	switch {
	case h.variant == "sem-over-grants" && l.Mode == backend.Permit:
		l.Limit++
	case h.variant == "weight-ignored" && l.Mode == backend.Permit:
		l.Weight = 1
	case h.variant == "weight-overcounts" && l.Mode == backend.Permit:
		l.Weight = max(l.Weight, 1) + 1
	case h.variant == "rw-writer-with-readers" && l.Mode == backend.Write:
		l.Mode = backend.Read
	}
	return l
}

// grant records (add) or forgets l's grant of a semaphore or read-write
// lock, and reports whether it was recorded before.
func (h *brokenHarness) grant(l backend.Claim, add bool) bool {
	if l.Mode == backend.Exclusive {
		return false
	}
	k := objectKey(l)
	h.mu.Lock()
	defer h.mu.Unlock()
	had := slices.Contains(h.granted[k], l.Token)
	if add {
		h.granted[k] = append(h.granted[k], l.Token)
	} else {
		h.granted[k] = slices.DeleteFunc(h.granted[k], func(t string) bool { return t == l.Token })
	}
	return had
}

// anyHolder returns a token that holds l's object, or "".
func (h *brokenHarness) anyHolder(l backend.Claim) string {
	k := objectKey(l)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.granted[k]) == 0 {
		return ""
	}
	return h.granted[k][0]
}

// objectKey names l's semaphore or read-write lock.
func objectKey(l backend.Claim) string {
	if l.Mode == backend.Permit {
		return l.Key + "\x00permit"
	}
	return l.Key + "\x00rw"
}
