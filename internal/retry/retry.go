// Package retry is the one retry policy of the module: how long to wait
// between tries (Backoff), how long a run of failures is ridden out
// (Failing, Budget), and Call, which puts them together for a single
// request. The locker package's waiting loop and every driver's own loop
// (native queues, notification listeners, transaction retries) use it, so
// that the budget the contract states holds on every backend.
package retry

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/lockerhq/locker/backend"
)

// Budget is how long a blocking acquisition keeps trying while every try
// fails to reach the store, before it returns the store's error. It is
// backend.StoreFailureBudget, named here for the loops that use it.
const Budget = backend.StoreFailureBudget

// Backoff doubles from Min to Max; each wait is drawn from [d/2, d] so
// that waiters who failed together spread out. The zero value waits Min
// = Max = 0: set both.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next returns the next wait.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur = min(b.cur*2, b.Max)
	}
	half := b.cur / 2
	return half + rand.N(b.cur-half+1)
}

// Reset starts the doubling again from Min, after a success.
func (b *Backoff) Reset() { b.cur = 0 }

// Pause waits the next wait; false if ctx ended first.
func (b *Backoff) Pause(ctx context.Context) bool { return Sleep(ctx, b.Next()) == nil }

// Failing tracks a run of failures: since when every try has failed.
// The zero value is a run of none.
type Failing struct {
	since time.Time
}

// Ok ends the run: a try reached the store.
func (f *Failing) Ok() { f.since = time.Time{} }

// Fail records a try sent at sent that failed, and reports whether the
// run has now lasted longer than budget, so that the caller gives up.
func (f *Failing) Fail(sent time.Time, budget time.Duration) (exhausted bool) {
	if f.since.IsZero() {
		f.since = sent
		return false
	}
	return time.Since(f.since) > budget
}

// Since is when the run began; zero when there is none.
func (f *Failing) Since() time.Time { return f.since }

// Retryable reports whether err may go away when the request is sent again:
// every error but the permanent ones (backend.Permanent) and the caller's
// own context's end.
func Retryable(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && !backend.Permanent(err)
}

// Call calls f until it returns nil, an error that isRetryable rejects,
// or an error after failures have lasted longer than budget, or ctx ends
// (then ctx's cause). isRetryable nil means Retryable. Between tries it
// waits as bo says.
func Call(ctx context.Context, bo Backoff, budget time.Duration, isRetryable func(error) bool, f func(context.Context) error) error {
	var run Failing
	for {
		sent := time.Now()
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		retryable := isRetryable != nil && isRetryable(err) || isRetryable == nil && Retryable(ctx, err)
		if !retryable || run.Fail(sent, budget) {
			return err
		}
		if !bo.Pause(ctx) {
			return context.Cause(ctx)
		}
	}
}

// Sleep waits for d or until ctx ends, whichever is first, and returns
// ctx.Err() in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
