package filelock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/conformance"
)

type harness struct{ dir string }

func (h harness) NewDriver(ctx context.Context) (backend.Driver, error) {
	return Open(ctx, "file://"+h.dir)
}

func (h harness) Expire(ctx context.Context, key string) error {
	d, err := New(h.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.expire(ctx, key); err != nil {
		return err
	}
	return d.expireObjects(ctx, key)
}

// expire makes the lock on key expired, as if its TTL had run out.
func (d *Driver) expire(ctx context.Context, key string) error {
	err := d.update(ctx, key, false, func(r *record, now int64) (change, error) {
		if !d.live(r, now) {
			return keep, nil
		}
		r.expires = now - 1
		if r.expires == 0 {
			r.expires = -1
		}
		return write, nil
	})
	if errors.Is(err, errNoFile) {
		return nil
	}
	return err
}

// expireObjects makes every holder of key's objects expired, for the tests.
func (d *Driver) expireObjects(ctx context.Context, key string) error {
	for _, m := range []backend.Mode{backend.Permit, backend.Read} {
		err := d.updateObject(ctx, backend.Claim{Key: key, Mode: m}, false, func(o *object, now int64) (bool, error) {
			for i := range o.holders {
				o.holders[i].expires = now
			}
			if o.waitExp != 0 {
				o.waitExp = now
			}
			return true, nil
		})
		if err != nil && !errors.Is(err, errNoFile) {
			return err
		}
	}
	return nil
}

// Residue counts the key's files: its lock file, semaphore, read-write
// lock, waiters' files and a resized semaphore's limit (the fence counter
// is the directory's).
func (h harness) Residue(ctx context.Context, key string) (int, error) {
	d := &Driver{dir: h.dir}
	n, err := h.waiterFiles(key)
	if err != nil {
		return 0, err
	}
	for _, p := range []string{d.Path(key), d.objectPath(key, backend.Permit), d.objectPath(key, backend.Read), d.limitPath(key)} {
		_, err := os.Stat(p)
		switch {
		case err == nil:
			n++
		case !errors.Is(err, os.ErrNotExist):
			return 0, err
		}
	}
	return n, nil
}

// waiterFiles counts the files of key's queued waiters (queue.go).
func (h harness) waiterFiles(key string) (int, error) {
	entries, err := os.ReadDir(h.dir)
	if err != nil {
		return 0, err
	}
	n := 0
	prefix := backend.ShortKey(key, maxBase) + waitSuffix
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			n++
		}
	}
	return n, nil
}

func (h harness) Traits() conformance.Traits {
	// A release removes the name's file.
	tr := conformance.Traits{TTL: 500 * time.Millisecond, Retention: 0}
	if runtime.GOOS == "linux" {
		// The lock's queue is in the directory; semaphores' and
		// read-write locks' waiters are woken unordered (see ticket).
		tr.FIFO = backend.Modes(backend.Exclusive)
	}
	return tr
}

func TestConformance(t *testing.T) {
	conformance.Run(t, harness{dir: t.TempDir()})
}

func TestConformanceNoSync(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	conformance.Run(t, noSync{harness{dir: t.TempDir()}})
}

type noSync struct{ harness }

func (h noSync) NewDriver(ctx context.Context) (backend.Driver, error) {
	return New(h.dir, WithSync(false))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func TestURLs(t *testing.T) {
	dir := t.TempDir()
	wd, _ := os.Getwd()
	good := map[string]string{
		"file://" + dir:                     dir,
		"file://" + dir + "/sub?sync=false": filepath.Join(dir, "sub"),
		"file://localhost" + dir:            dir,
		"file:rel/x":                        filepath.Join(wd, "rel/x"),
		"file://" + dir + "/sp%20ace":       filepath.Join(dir, "sp ace"),
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(wd, "rel")) })
	for raw, want := range good {
		d, err := Open(ctx(t), raw)
		if err != nil {
			t.Errorf("Open(%q): %v", raw, err)
			continue
		}
		if got := d.Dir(); got != want {
			t.Errorf("Open(%q) dir %q, want %q", raw, got, want)
		}
		if strings.Contains(raw, "sync=false") == d.sync {
			t.Errorf("Open(%q): sync %v", raw, d.sync)
		}
	}
	for _, raw := range []string{"file://", "file://host/dir", "file://u:secret@/dir", "file://" + dir + "?sync=maybe", "file://" + dir + "?x=1"} {
		_, err := Open(ctx(t), raw)
		if !errors.Is(err, backend.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", raw, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): error shows the password: %v", raw, err)
		}
	}
	f := filepath.Join(dir, "plain")
	os.WriteFile(f, nil, 0o600)
	if _, err := New(f); err == nil {
		t.Errorf("New on a plain file succeeded")
	}
	if d, err := Open(ctx(t), "file://"+dir+"?sync=false", WithSync(true)); err != nil || !d.sync {
		t.Errorf("Open with sync=false and WithSync(true): %v, want sync on", err)
	}
	if _, err := Open(ctx(t), "mem://x"); !errors.Is(err, backend.ErrInvalidURL) {
		t.Errorf("Open(mem://x) = %v, want ErrInvalidURL", err)
	}
}

func lock(key, tok string) backend.Claim {
	return backend.Claim{Key: key, Token: tok, TTL: time.Minute}
}

func TestFencePersistsAcrossDrivers(t *testing.T) {
	dir := t.TempDir()
	var last uint64
	for i := range 5 {
		d, err := New(dir, WithSync(i%2 == 0))
		if err != nil {
			t.Fatal(err)
		}
		g, err := d.TryAcquire(ctx(t), lock("ns/a", "tok"+string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		if g.Fence <= last {
			t.Fatalf("fence %d after %d", g.Fence, last)
		}
		last = g.Fence
		if err := d.Release(ctx(t), lock("ns/a", "tok"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
		d.Close()
	}
	// Released: the name's file is gone, the directory's counter stays.
	if _, err := os.Stat(filepath.Join(dir, "ns%2Fa.lock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file after the release: %v, want none", err)
	}
	if _, err := os.Stat(filepath.Join(dir, counterName)); err != nil {
		t.Fatalf("fence counter: %v", err)
	}
}

func TestIdempotentAcquireAndToken(t *testing.T) {
	d, _ := New(t.TempDir())
	g1, err := d.TryAcquire(ctx(t), lock("k", "t1"))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.TryAcquire(ctx(t), lock("k", "t1"))
	if err != nil || g2.Fence != g1.Fence {
		t.Fatalf("retried acquire by the holder: %v, fence %d then %d", err, g1.Fence, g2.Fence)
	}
	if _, err := d.TryAcquire(ctx(t), lock("k", "t2")); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("other token: %v", err)
	}
	if err := d.Refresh(ctx(t), lock("missing", "t1")); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("refresh of a key never locked: %v", err)
	}
	if err := d.Release(ctx(t), lock("missing", "t1")); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("release of a key never locked: %v", err)
	}
	b, _ := os.ReadFile(d.Path("k"))
	if strings.Contains(string(b), "t1") {
		t.Fatalf("the state file holds the token in clear")
	}
	h, err := d.Inspect(ctx(t), "k", backend.Exclusive)
	if err != nil || !h.Held || h.Fence != g1.Fence || h.TTL <= 0 || h.TTL > time.Minute {
		t.Fatalf("Inspect = %+v, %v", h, err)
	}
	d.Close()
	if _, err := d.TryAcquire(ctx(t), lock("k2", "t1")); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// A torn write damages one record; the other still holds the previous
// state, fence included.
func TestTornWriteKeepsPreviousState(t *testing.T) {
	d, _ := New(t.TempDir())
	if _, err := d.TryAcquire(ctx(t), lock("k", "t1")); err != nil {
		t.Fatal(err)
	}
	short := lock("k", "t1")
	short.TTL = time.Millisecond
	if err := d.Refresh(ctx(t), short); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	// seq is 2 now: the refresh (to a TTL that ran out) went to record 0.
	// Damage it.
	f, _ := os.OpenFile(d.Path("k"), os.O_RDWR, 0)
	f.WriteAt([]byte("garbage"), 100)
	f.Close()
	// Record 1 (the acquisition, fence 1, held by t1) is what remains.
	if _, err := d.TryAcquire(ctx(t), lock("k", "t2")); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("acquire after a torn refresh = %v, want the previous state (held)", err)
	}
	if err := d.Release(ctx(t), lock("k", "t1")); err != nil {
		t.Fatal(err)
	}
	g, err := d.TryAcquire(ctx(t), lock("k", "t2"))
	if err != nil || g.Fence != 2 {
		t.Fatalf("acquire = %v, fence %d, want 2", err, g.Fence)
	}
	// Both damaged: an error naming the file, never a reset fence.
	os.WriteFile(d.Path("k"), []byte(strings.Repeat("x", 2*recSize)), 0o600)
	if _, err := d.TryAcquire(ctx(t), lock("k", "t3")); err == nil || !strings.Contains(err.Error(), d.Path("k")) {
		t.Fatalf("acquire on a damaged file = %v", err)
	}
}

// A lock written during another boot counts as free, and its fence goes on.
func TestOtherBootIsFree(t *testing.T) {
	d, _ := New(t.TempDir())
	if _, err := d.TryAcquire(ctx(t), lock("k", "t1")); err != nil {
		t.Fatal(err)
	}
	other := &Driver{dir: d.dir, sync: d.sync, clk: d.clk}
	other.clk.boot[0] ^= 1
	if d.clk.boot == other.clk.boot {
		t.Skip("no boot ID on this platform")
	}
	g, err := other.TryAcquire(ctx(t), lock("k", "t2"))
	if err != nil || g.Fence <= 1 {
		t.Fatalf("acquire in another boot = %v, fence %d, want above 1", err, g.Fence)
	}
}

// A power cut may lose the counter's last writes (they are not fsynced):
// with the counter gone back, or gone, fences go on above the ceiling,
// which is fsynced before any fence above it is given.
func TestCounterLostGoesOnAboveCeiling(t *testing.T) {
	dir := t.TempDir()
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if d.clk.boot == ([16]byte{}) {
		t.Skip("no boot ID: every fence is fsynced in the counter")
	}
	counter := filepath.Join(dir, counterName)
	var last uint64
	var early []byte
	for i := range 3 {
		l := lock("ns/a", "t"+string(rune('a'+i)))
		g, err := d.TryAcquire(ctx(t), l)
		if err != nil || g.Fence <= last {
			t.Fatalf("acquire %d = %v, fence %d after %d", i, err, g.Fence, last)
		}
		last = g.Fence
		if err := d.Release(ctx(t), l); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			early, _ = os.ReadFile(counter)
		}
	}
	// The counter's state after the first fence, as if the later writes
	// were lost, written in the boot before; then no counter at all.
	var r record
	if rr, ok := decode(early[recSize:]); ok {
		r = rr
	} else if rr, ok := decode(early[:recSize]); ok {
		r = rr
	}
	r.boot[0] ^= 1
	old := r.encode()
	for _, tc := range []struct {
		name  string
		state []byte
	}{{"older, from another boot", append(old, old...)}, {"empty", nil}, {"damaged", []byte(strings.Repeat("x", 2*recSize))}} {
		if err := os.WriteFile(counter, tc.state, 0o600); err != nil {
			t.Fatal(err)
		}
		l := lock("ns/a", "after "+tc.name)
		g, err := d.TryAcquire(ctx(t), l)
		if err != nil || g.Fence <= last {
			t.Fatalf("counter %s: acquire = %v, fence %d, want above %d", tc.name, err, g.Fence, last)
		}
		last = g.Fence
		if err := d.Release(ctx(t), l); err != nil {
			t.Fatal(err)
		}
	}
}

// Many goroutines with their own drivers (as processes would be) never
// share the lock.
func TestExclusionAcrossDrivers(t *testing.T) {
	dir := t.TempDir()
	var inside, total int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			d, _ := New(dir, WithSync(false))
			c, _ := locker.New(d)
			defer c.Close()
			for range 20 {
				err := c.Do(ctx(t), "x", func(context.Context) error {
					mu.Lock()
					inside++
					n := inside
					mu.Unlock()
					if n != 1 {
						t.Errorf("worker %d: %d inside", w, n)
					}
					time.Sleep(100 * time.Microsecond)
					mu.Lock()
					inside--
					total++
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if total != 160 {
		t.Fatalf("total %d", total)
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	for _, sync := range []bool{true, false} {
		name := "sync"
		if !sync {
			name = "nosync"
		}
		b.Run(name, func(b *testing.B) {
			d, _ := New(b.TempDir(), WithSync(sync))
			ctx := context.Background()
			l := lock("ns/bench", "tok")
			for b.Loop() {
				if _, err := d.TryAcquire(ctx, l); err != nil {
					b.Fatal(err)
				}
				if err := d.Release(ctx, l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRefresh(b *testing.B) {
	d, _ := New(b.TempDir())
	ctx := context.Background()
	l := lock("ns/bench", "tok")
	if _, err := d.TryAcquire(ctx, l); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := d.Refresh(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
}

// List names a key whose file name is shortened (a hash) by the key the
// file records, and a file of an older version (no recorded key) by its
// name, until its next write records the key.
func TestListLongKeysAndOlderFiles(t *testing.T) {
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	long := "ns/" + strings.Repeat("ü", 150)
	if !strings.Contains(filepath.Base(d.Path(long)), "~") {
		t.Fatal("the long key's file name is not shortened")
	}
	for _, k := range []string{long, "ns/short"} {
		if _, err := d.TryAcquire(ctx(t), backend.Claim{Key: k, Token: "t", TTL: time.Minute, Owner: "o"}); err != nil {
			t.Fatal(err)
		}
	}
	keys := func() []string {
		t.Helper()
		got, err := d.List(ctx(t), "ns/", backend.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, st := range got {
			if !st.Held || st.Owner != "o" {
				t.Errorf("List: %+v", st)
			}
			ks = append(ks, st.Key)
		}
		slices.Sort(ks)
		return ks
	}
	if got := keys(); !slices.Equal(got, []string{"ns/short", long}) {
		t.Fatalf("List = %q", got)
	}
	// Files as older versions wrote them: the two records only.
	for _, k := range []string{long, "ns/short"} {
		if err := os.Truncate(d.Path(k), 2*recSize); err != nil {
			t.Fatal(err)
		}
	}
	if got := keys(); !slices.Equal(got, []string{"ns/short"}) {
		t.Fatalf("List of older files = %q, want the short key only", got)
	}
	if err := d.Refresh(ctx(t), backend.Claim{Key: long, Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if got := keys(); !slices.Equal(got, []string{"ns/short", long}) {
		t.Fatalf("List after a refresh = %q", got)
	}
	// The Client names the operation: the driver says only what it found.
	if _, err := d.Break(ctx(t), "ns/short", backend.Exclusive, 1<<40); !errors.Is(err, backend.ErrNotHeld) || err.Error() != "filelock: not held" {
		t.Fatalf("Break under another fence = %v, want ErrNotHeld", err)
	}
}
