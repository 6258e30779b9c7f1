package locker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/memlock"
)

// The store records who holds a lock even when nobody said: the host and
// process, as ShedLock's lockedBy.
func TestDefaultLabelIsHostAndPID(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore())
	l, err := c.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	want := fmt.Sprintf("%s:%d", host, os.Getpid())
	if l.Label() != want {
		t.Errorf("Label() = %q, want %q", l.Label(), want)
	}
	st, err := c.Inspect(ctx, "job")
	if err != nil || st.Owner != want {
		t.Errorf("Inspect = %+v, %v; want Owner %q", st, err, want)
	}
}

func TestLabelClientWideAndPerCall(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore(), locker.WithLabel("billing-7"))
	a, err := c.TryAcquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.TryAcquire(ctx, "b", locker.Label("invoice run"))
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.List(ctx, "")
	if err != nil || len(all) != 2 || all[0].Owner != "billing-7" || all[1].Owner != "invoice run" {
		t.Fatalf("List = %+v, %v; want a by billing-7, b by invoice run", all, err)
	}
	if a.Label() != "billing-7" || b.Label() != "invoice run" {
		t.Errorf("Label() = %q, %q", a.Label(), b.Label())
	}
	// The label is no claim to the hold: the same label is refused.
	if _, err := c.TryAcquire(ctx, "b", locker.Label("invoice run")); !errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("TryAcquire under the holder's label = %v, want ErrNotAcquired", err)
	}
}

func TestBadLabelTypedError(t *testing.T) {
	ctx := context.Background()
	long := strings.Repeat("x", locker.MaxLabelLen+1)
	if _, err := locker.New(memDriver(memlock.NewStore()), locker.WithLabel(long)); !errors.Is(err, locker.ErrInvalidName) {
		t.Errorf("New with a %d-byte label = %v, want ErrInvalidName", len(long), err)
	}
	if _, err := locker.Open(ctx, "mem://bad-label", locker.WithLabel("a\x00b")); !errors.Is(err, locker.ErrInvalidName) {
		t.Errorf("Open with a NUL in the label = %v, want ErrInvalidName", err)
	}
	c := newClient(t, memlock.NewStore())
	for _, bad := range []string{long, "\xff", "a\x00"} {
		if _, err := c.TryAcquire(ctx, "x", locker.Label(bad)); !errors.Is(err, locker.ErrInvalidName) {
			t.Errorf("TryAcquire with Label(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
	if l, err := c.TryAcquire(ctx, "x", locker.Label(strings.Repeat("é", locker.MaxLabelLen/2))); err != nil {
		t.Errorf("TryAcquire with a %d-byte label: %v", locker.MaxLabelLen, err)
	} else {
		l.Release(ctx)
	}
}

// Owner, deprecated, still does both jobs it did: existing callers keep
// their reentrancy and their label.
func TestOwnerIsReentrantAndLabel(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore())
	outer, err := c.TryAcquire(ctx, "x", locker.Owner("req-1"))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.TryAcquire(ctx, "x", locker.Owner("req-1"))
	if err != nil || inner.Fence() != outer.Fence() {
		t.Fatalf("second Owner acquisition = %v, want a re-entry", err)
	}
	if st, err := c.Inspect(ctx, "x"); err != nil || st.Owner != "req-1" {
		t.Errorf("Inspect = %+v, %v; want Owner req-1", st, err)
	}
	inner.Release(ctx)
	outer.Release(ctx)
}

// A Reentrant key re-enters whatever the label, and keeps the outermost
// acquisition's label.
func TestReentrantApartFromLabel(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, memlock.NewStore(), locker.WithLabel("host-a"))
	outer, err := c.TryAcquire(ctx, "x", locker.Reentrant("req-1"))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.TryAcquire(ctx, "x", locker.Reentrant("req-1"), locker.Label("other"))
	if err != nil || inner.Fence() != outer.Fence() || inner.Label() != "host-a" {
		t.Fatalf("re-entry = %v (label %q), want a re-entry labelled host-a", err, inner.Label())
	}
	if _, err := c.TryAcquire(ctx, "x", locker.Reentrant("req-2")); !errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("another key = %v, want ErrNotAcquired", err)
	}
	if st, err := c.Inspect(ctx, "x"); err != nil || st.Owner != "host-a" {
		t.Errorf("Inspect = %+v, %v; want Owner host-a, the label, not the key", st, err)
	}
	inner.Release(ctx)
	outer.Release(ctx)
}
