package filelock

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

// A limit set by Resize is a file of its own: it stands on a free
// semaphore, through its holders' comings and goings and a reboot, fails
// closed when damaged, and Resize 0 removes it.
func TestResizeRecord(t *testing.T) {
	dir, ctx := t.TempDir(), ctx(t)
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	files := func(want int, when string) {
		t.Helper()
		if n, err := (harness{dir: dir}).Residue(ctx, "k"); err != nil || n != want {
			t.Fatalf("%s: %d files of the name (%v), want %d", when, n, err, want)
		}
	}
	limit := func(d *Driver, want int, when string) {
		t.Helper()
		if st, err := d.Inspect(ctx, "k", backend.Permit); err != nil || st.Limit != want {
			t.Fatalf("%s: Inspect = %+v, %v; want Limit %d", when, st, err, want)
		}
	}
	permit := func(tok string) backend.Claim {
		return backend.Claim{Key: "k", Token: tok, TTL: time.Hour, Mode: backend.Permit, Limit: 5}
	}
	try := func(d *Driver, toks ...string) {
		t.Helper()
		for _, tok := range toks {
			if _, err := d.TryAcquire(ctx, permit(tok)); err != nil {
				t.Fatalf("permit %s: %v", tok, err)
			}
		}
		if _, err := d.TryAcquire(ctx, permit("one more")); !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("a permit past the limit of 2 = %v, want ErrNotAcquired", err)
		}
	}
	release := func(d *Driver, toks ...string) {
		t.Helper()
		for _, tok := range toks {
			if err := d.Release(ctx, permit(tok)); err != nil {
				t.Fatal(err)
			}
		}
	}

	if err := d.Resize(ctx, "k", 2); err != nil {
		t.Fatal(err)
	}
	files(1, "resized, free")
	limit(d, 2, "resized, free")
	try(d, "a", "b")
	files(2, "held")
	release(d, "a", "b")
	files(1, "released")
	limit(d, 2, "released")

	if d.clk.boot != ([16]byte{}) {
		other := &Driver{dir: d.dir, sync: d.sync, clk: d.clk}
		other.clk.boot[0] ^= 1
		limit(other, 2, "after a reboot")
		try(other, "c", "d")
		release(other, "c", "d")
	}

	path := d.limitPath("k")
	if err := os.WriteFile(path, []byte(strings.Repeat("x", 2*recSize)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, permit("e")); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a permit beside a damaged limit = %v, want an error naming %s", err, path)
	}
	if err := d.Resize(ctx, "k", 2); err != nil {
		t.Fatalf("Resize over a damaged limit: %v", err)
	}
	try(d, "e", "f")
	release(d, "e", "f")

	for range 2 {
		if err := d.Resize(ctx, "k", 0); err != nil {
			t.Fatal(err)
		}
	}
	files(0, "removed")
	limit(d, 0, "removed")
}
