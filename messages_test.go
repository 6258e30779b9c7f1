package locker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/memlock"
)

// Open's refusals say what to write instead.
func TestOpenMessagesHelp(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		url  string
		want error
		text string
	}{
		{"127.0.0.1:6379", locker.ErrInvalidURL, `no scheme in "127.0.0.1:6379": did you mean redis://127.0.0.1:6379?`},
		{"localhost:2379", locker.ErrInvalidURL, "did you mean etcd://localhost:2379?"},
		{"[::1]:11211", locker.ErrInvalidURL, "did you mean memcache://[::1]:11211?"},
		{"10.0.0.7:9999", locker.ErrInvalidURL, "did you mean SCHEME://10.0.0.7:9999, SCHEME one of "},
		{"db.internal/locks", locker.ErrInvalidURL, "no scheme: a backend URL starts with one of "},
		{"nosuch://x", locker.ErrInvalidURL, `unknown scheme "nosuch": registered are `},
		{"mem://?ttl=0s", locker.ErrInvalidTTL, "locker: Open: invalid ttl: ttl=0s: a lock's TTL must be more than 0 and at most 720h0m0s"},
		{"mem://?ttl=5s&ttl=6s", locker.ErrInvalidURL, "parameter ttl given 2 times"},
		{"mem://?namespace=a&namespace=b", locker.ErrInvalidURL, "parameter namespace given 2 times"},
		{"mem://?bogus=1&bogus=2", locker.ErrInvalidURL, "parameter(s) bogus given more than once"},
	} {
		_, err := locker.Open(ctx, tc.url)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("Open(%q) = %v, want %v saying %q", tc.url, err, tc.want, tc.text)
		}
	}
	// The schemes listed are the registered ones, mem among them.
	for _, raw := range []string{"nosuch://x", "10.0.0.7:9999"} {
		if _, err := locker.Open(ctx, raw); err == nil || !strings.Contains(err.Error(), "mem") {
			t.Errorf("Open(%q) = %v, want the registered schemes listed", raw, err)
		}
	}
	// Text that may hold a password is not quoted back.
	if _, err := locker.Open(ctx, "admin:s3cret@10.0.0.7/x"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Open of user:password@host = %v, want an error without the password", err)
	}
	_, err := locker.New(memDriver(memlock.NewStore()), locker.WithDefaultTTL(0))
	if !errors.Is(err, locker.ErrInvalidTTL) || err.Error() != "locker: New: WithDefaultTTL: invalid ttl: 0s (want more than 0, at most 720h0m0s)" {
		t.Errorf("New with WithDefaultTTL(0) = %v", err)
	}
}

// A refusal because another holds the lock names that holder, where the
// store records it: a TryAcquire's, and a wait's that ran out of time.
func TestBusyMessageNamesHolder(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore()
	a := newClient(t, store, locker.WithLabel("billing-7"))
	b := newClient(t, store)
	l, err := a.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	by := ` (held by "billing-7", fence `
	_, err = b.TryAcquire(ctx, "job")
	if !errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), by) {
		t.Errorf("TryAcquire of a held lock = %v, want it to say%s...", err, by)
	}
	err = b.TryDo(ctx, "job", func(context.Context) error { return nil })
	if !errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), by) {
		t.Errorf("TryDo of a held lock = %v, want it to say%s...", err, by)
	}
	_, err = b.Acquire(ctx, "job", locker.WaitAtMost(50*time.Millisecond))
	if !errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), "waited 50ms"+by) {
		t.Errorf("Acquire with WaitAtMost = %v, want it to say waited 50ms%s...", err, by)
	}
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(dctx, "job")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), by) {
		t.Errorf("Acquire past the caller's deadline = %v, want it to say%s...", err, by)
	}
	// A caller that cancelled reads no message: nothing is looked up.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err = b.Acquire(cctx, "job"); !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "held by") {
		t.Errorf("cancelled Acquire = %v, want context.Canceled without a holder", err)
	}
	// A backend that cannot inspect says what it knows.
	bare := newClientOn(t, plain{memDriver(store)})
	if _, err := bare.TryAcquire(ctx, "job"); err == nil || err.Error() != `locker: try-acquire "job": not acquired` {
		t.Errorf("TryAcquire without an Inspector = %v", err)
	}
	l.Release(ctx)
}
