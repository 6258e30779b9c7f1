package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

func TestBackoffDoublesWithinBounds(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	caps := []time.Duration{10, 20, 40, 80, 80}
	for i, c := range caps {
		c *= time.Millisecond
		if d := b.Next(); d < c/2 || d > c {
			t.Fatalf("wait %d = %v, want in [%v, %v]", i, d, c/2, c)
		}
	}
	b.Reset()
	if d := b.Next(); d > 10*time.Millisecond {
		t.Fatalf("after Reset: %v, want <= 10ms", d)
	}
}

func TestCallStopsAtPermanentError(t *testing.T) {
	calls := 0
	err := Call(context.Background(), Backoff{Min: time.Millisecond, Max: time.Millisecond}, time.Minute, nil, func(context.Context) error {
		calls++
		return fmt.Errorf("wrapped: %w", backend.ErrPermission)
	})
	if !errors.Is(err, backend.ErrPermission) || calls != 1 {
		t.Fatalf("err %v after %d calls, want ErrPermission after 1", err, calls)
	}
}

func TestCallRidesOutFailuresWithinBudget(t *testing.T) {
	calls := 0
	err := Call(context.Background(), Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}, time.Minute, nil, func(context.Context) error {
		if calls++; calls < 5 {
			return errors.New("connection refused")
		}
		return nil
	})
	if err != nil || calls != 5 {
		t.Fatalf("err %v after %d calls, want nil after 5", err, calls)
	}
}

func TestCallGivesUpAfterBudget(t *testing.T) {
	store := errors.New("connection refused")
	start := time.Now()
	budget := 100 * time.Millisecond
	err := Call(context.Background(), Backoff{Min: 5 * time.Millisecond, Max: 10 * time.Millisecond}, budget, nil, func(context.Context) error { return store })
	took := time.Since(start)
	if !errors.Is(err, store) {
		t.Fatalf("err %v, want the store's error", err)
	}
	// The budget counts from the first failure; one more wait and try may
	// follow it. 2 s is far above that and far below "never".
	if took < budget || took > 2*time.Second {
		t.Fatalf("gave up after %v, want after %v and well before 2s", took, budget)
	}
}

func TestCallReturnsContextCause(t *testing.T) {
	cause := errors.New("caller gave up")
	ctx, cancel := context.WithCancelCause(context.Background())
	calls := 0
	err := Call(ctx, Backoff{Min: time.Millisecond, Max: time.Millisecond}, time.Minute, nil, func(context.Context) error {
		if calls++; calls == 3 {
			cancel(cause)
		}
		return errors.New("timeout")
	})
	if !errors.Is(err, cause) || calls != 3 {
		t.Fatalf("err %v after %d calls, want the cause after 3", err, calls)
	}
}

func TestFailingRun(t *testing.T) {
	var f Failing
	if f.Fail(time.Now().Add(-time.Hour), time.Second) {
		t.Fatal("the first failure exhausted the budget")
	}
	if !f.Fail(time.Now(), time.Second) {
		t.Fatal("a run begun an hour ago is within a 1s budget")
	}
	f.Ok()
	if !f.Since().IsZero() || f.Fail(time.Now(), time.Second) {
		t.Fatal("Ok did not end the run")
	}
}

func TestPause(t *testing.T) {
	b := Backoff{Min: time.Millisecond, Max: time.Millisecond}
	if !b.Pause(context.Background()) {
		t.Error("Pause on a live context = false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if b.Pause(ctx) {
		t.Error("Pause on an ended context = true")
	}
}
