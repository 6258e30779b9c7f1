package filelock

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

func client(t *testing.T, dir string) *locker.Client {
	t.Helper()
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := locker.New(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// residue counts the files of name in the Client's default namespace.
func residue(t *testing.T, dir, key string) int {
	t.Helper()
	n, err := harness{dir: dir}.Residue(context.Background(), backend.Key("locker", key))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Two drivers on one directory share a semaphore; the last release leaves
// no file.
func TestSemaphoreAcrossDrivers(t *testing.T) {
	dir, ctx := t.TempDir(), ctx(t)
	c1, c2 := client(t, dir), client(t, dir)
	a, err := c1.TryAcquire(ctx, "s", locker.Semaphore(2))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c2.TryAcquire(ctx, "s", locker.Semaphore(2))
	if err != nil {
		t.Fatal(err)
	}
	if b.Fence() <= a.Fence() {
		t.Fatalf("fences %d then %d, want increasing", a.Fence(), b.Fence())
	}
	if _, err := c2.TryAcquire(ctx, "s", locker.Semaphore(2)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("third permit of 2: %v, want ErrNotAcquired", err)
	}
	if _, err := c1.TryAcquire(ctx, "s", locker.Semaphore(3)); !errors.Is(err, locker.ErrLimitMismatch) {
		t.Fatalf("limit 3 while held under 2: %v, want ErrLimitMismatch", err)
	}
	// The lock of the same name is another object.
	l, err := c2.TryAcquire(ctx, "s")
	if err != nil {
		t.Fatalf("lock beside a full semaphore: %v", err)
	}
	if n := residue(t, dir, "s"); n != 2 {
		t.Fatalf("residue %d, want the lock's and the semaphore's files", n)
	}
	for _, h := range []*locker.Lock{a, b, l} {
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := residue(t, dir, "s"); n != 0 {
		t.Fatalf("residue %d after release, want 0", n)
	}
	c, err := c2.TryAcquire(ctx, "s", locker.Semaphore(3))
	if err != nil {
		t.Fatalf("limit 3 once free: %v", err)
	}
	if c.Fence() <= b.Fence() {
		t.Fatalf("fence %d after a release, want above %d", c.Fence(), b.Fence())
	}
	c.Release(ctx)
}

// A refused writer keeps readers out until it gives up, and giving up
// leaves nothing.
func TestRWWaitingWriterAcrossDrivers(t *testing.T) {
	dir, ctx := t.TempDir(), ctx(t)
	c1, c2 := client(t, dir), client(t, dir)
	r, err := c1.TryAcquire(ctx, "rw", locker.Read())
	if err != nil {
		t.Fatal(err)
	}
	// The writer waits until cancelled below, not for a set time that a
	// loaded machine could spend before its first try.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c2.Acquire(wctx, "rw", locker.Write())
		done <- err
	}()
	// Once the writer has tried, its record keeps new readers out.
	refused := false
	for deadline := time.Now().Add(5 * time.Second); !refused && time.Now().Before(deadline); {
		x, err := c1.TryAcquire(ctx, "rw", locker.Read())
		if errors.Is(err, locker.ErrNotAcquired) {
			refused = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		x.Release(ctx)
		time.Sleep(2 * time.Millisecond)
	}
	if !refused {
		t.Fatal("readers still enter while a writer waits")
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("writer acquired beside a reader")
	}
	// Withdrawn: readers enter again.
	r2, err := c1.TryAcquire(ctx, "rw", locker.Read())
	if err != nil {
		t.Fatalf("reader after the writer gave up: %v", err)
	}
	r.Release(ctx)
	r2.Release(ctx)
	if n := residue(t, dir, "rw"); n != 0 {
		t.Fatalf("residue %d, want 0", n)
	}
	w, err := c2.TryAcquire(ctx, "rw", locker.Write())
	if err != nil {
		t.Fatal(err)
	}
	if w.Fence() <= r2.Fence() {
		t.Fatalf("writer's fence %d, want above the reader's %d", w.Fence(), r2.Fence())
	}
	if _, err := c1.TryAcquire(ctx, "rw", locker.Read()); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("reader beside a writer: %v", err)
	}
	w.Release(ctx)
}

// An object file written in another boot counts as empty, damaged or not;
// one of this boot keeps its state through a killed write, and fails
// closed when damaged.
func TestObjectOfOtherBootIsEmpty(t *testing.T) {
	dir, ctx := t.TempDir(), ctx(t)
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.clk.boot == [16]byte{} {
		t.Skip("no boot ID off Linux")
	}
	c := backend.Claim{Key: "k", Token: "t1", TTL: time.Hour, Mode: backend.Permit, Limit: 1}
	if _, err := d.TryAcquire(ctx, c); err != nil {
		t.Fatal(err)
	}
	path := d.objectPath("k", backend.Permit)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[8] ^= 1        // another boot
	b[len(b)-1] ^= 1 // and a torn tail
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c.Token = "t2"
	if _, err := d.TryAcquire(ctx, c); err != nil {
		t.Fatalf("permit over an earlier boot's file: %v", err)
	}
	// A write killed before its header (a body half written past the
	// current one) leaves the previous state.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte(strings.Repeat("x", 300)))
	f.Close()
	c.Token = "t3"
	if _, err := d.TryAcquire(ctx, c); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("permit beside t2's after a killed write: %v, want ErrNotAcquired", err)
	}
	// This boot's damaged file fails closed.
	b, _ = os.ReadFile(path)
	b[objHeader] ^= 1 // t2's body
	os.WriteFile(path, b, 0o600)
	if _, err := d.TryAcquire(ctx, c); err == nil || errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("permit over a damaged file: %v, want an error naming it", err)
	}
}

const holdEnv = "FILELOCK_TEST_HOLD_PERMIT"

// A holder killed with -9 frees its permit TTL after its last refresh.
func TestSemaphoreHolderKilled(t *testing.T) {
	if dir := os.Getenv(holdEnv); dir != "" {
		holdPermit(dir)
		return
	}
	dir, ctx := t.TempDir(), ctx(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSemaphoreHolderKilled$")
	cmd.Env = append(os.Environ(), holdEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	ready := make([]byte, 1)
	if _, err := out.Read(ready); err != nil {
		t.Fatalf("child: %v", err)
	}
	c := client(t, dir)
	if _, err := c.TryAcquire(ctx, "s", locker.Semaphore(1)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("permit held by the child: %v, want ErrNotAcquired", err)
	}
	// The child refreshes every TTL/3: its permit outlives one TTL.
	time.Sleep(700 * time.Millisecond)
	if _, err := c.TryAcquire(ctx, "s", locker.Semaphore(1)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("refreshed permit of a live child: %v, want ErrNotAcquired", err)
	}
	killed := time.Now()
	if err := cmd.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	p, err := c.Acquire(ctx, "s", locker.Semaphore(1))
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(killed); waited > 500*time.Millisecond+time.Second {
		t.Fatalf("permit freed %v after the kill, want within TTL 500ms plus polling", waited)
	}
	p.Release(ctx)
	if n := residue(t, dir, "s"); n != 0 {
		t.Fatalf("residue %d, want 0", n)
	}
}

func holdPermit(dir string) {
	d, err := New(dir)
	if err != nil {
		os.Exit(2)
	}
	c, err := locker.New(d)
	if err != nil {
		os.Exit(2)
	}
	if _, err := c.TryAcquire(context.Background(), "s", locker.Semaphore(1), locker.TTL(500*time.Millisecond)); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(3)
	}
	os.Stdout.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	time.Sleep(time.Minute) // until killed
	os.Exit(4)
}

// Entries implements conformance.WaiterCounter: the lock file's holder
// and queued waiters' files, and every holder and waiting writer's record
// in the key's object files, expired or not (all that the files keep).
func (h harness) Entries(ctx context.Context, key string) (int, error) {
	d, err := New(h.dir)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	n, err := h.waiterFiles(key)
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(d.Path(key)); err == nil {
		n++
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	for _, m := range []backend.Mode{backend.Permit, backend.Read} {
		path := d.objectPath(key, m)
		f, err := openLocked(ctx, path, false)
		if errors.Is(err, errNoFile) {
			continue
		}
		if err != nil {
			return 0, err
		}
		o, _, err := d.readObject(f.File, path)
		f.Close()
		if err != nil {
			return 0, err
		}
		n += len(o.holders)
		if o.waitExp != 0 {
			n++
		}
	}
	return n, nil
}

// BenchmarkModes compares an uncontended acquire+release in each mode
// (sync=false, so that the counter's fsyncs do not dominate).
func BenchmarkModes(b *testing.B) {
	for _, m := range []backend.Mode{backend.Exclusive, backend.Permit, backend.Read, backend.Write} {
		b.Run(m.String(), func(b *testing.B) {
			d, _ := New(b.TempDir(), WithSync(false))
			ctx := context.Background()
			c := backend.Claim{Key: "ns/bench", Token: "tok", TTL: time.Minute, Mode: m, Limit: 4}
			for b.Loop() {
				if _, err := d.TryAcquire(ctx, c); err != nil {
					b.Fatal(err)
				}
				if err := d.Release(ctx, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A full object (MaxLimit holders with the longest owners) fits its file,
// and readers past MaxLimit wait rather than outgrow it.
func TestObjectHoldsMaxLimit(t *testing.T) {
	dir, ctx := t.TempDir(), ctx(t)
	d, err := New(dir, WithSync(false))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	now := d.clk.now()
	for _, m := range []backend.Mode{backend.Permit, backend.Read} {
		o := object{limit: backend.MaxLimit}
		for i := range backend.MaxLimit {
			o.holders = append(o.holders, holder{token: hashToken(strconv.Itoa(i)), fence: uint64(i + 1), expires: now + int64(time.Minute), mode: m, owner: strings.Repeat("o", 100)})
		}
		if n := len(encodeBody(&o)); n > objMaxBody {
			t.Fatalf("%d bytes, above objMaxBody %d", n, objMaxBody)
		}
		f, err := os.Create(d.objectPath("k", m))
		if err != nil {
			t.Fatal(err)
		}
		err = d.writeObject(f, f.Name(), &o, extent{off: objHeader})
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		c := backend.Claim{Key: "k", Token: "one more", TTL: time.Minute, Mode: m, Limit: backend.MaxLimit}
		if _, err := d.TryAcquire(ctx, c); !errors.Is(err, backend.ErrNotAcquired) {
			t.Fatalf("%v past MaxLimit: %v, want ErrNotAcquired", m, err)
		}
		c.Token = strconv.Itoa(backend.MaxLimit - 1)
		if err := d.Refresh(ctx, c); err != nil {
			t.Fatalf("%v: refresh in a full file: %v", m, err)
		}
	}
}

// The file keeps the current body and at most the previous one: it grows
// and shrinks with the number of holders.
func TestObjectFileStaysSmall(t *testing.T) {
	dir, ctx := t.TempDir(), ctx(t)
	d, err := New(dir, WithSync(false))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c := backend.Claim{Key: "k", TTL: time.Minute, Mode: backend.Permit, Limit: 100}
	size := func() int64 {
		fi, err := os.Stat(d.objectPath("k", backend.Permit))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	largest := int64(0)
	for i := range 100 {
		c.Token = strconv.Itoa(i)
		if _, err := d.TryAcquire(ctx, c); err != nil {
			t.Fatal(err)
		}
		largest = max(largest, size())
	}
	full := int64(objHeader + objBodyHdr + 100*objEntry)
	if largest > objHeader+3*(full-objHeader) {
		t.Fatalf("file grew to %d bytes for a body of at most %d", largest, full-objHeader)
	}
	for i := range 99 {
		c.Token = strconv.Itoa(i)
		if err := d.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if n := size(); n > objHeader+3*(objBodyHdr+objEntry) {
		t.Fatalf("%d bytes left for one holder", n)
	}
}

// A body with a holder of several permits ends with the holders' weights;
// one without is the older layout, whose holders take one permit each.
func TestObjectWeights(t *testing.T) {
	o := object{limit: 5, holders: []holder{{fence: 1, weight: 3, owner: "a"}, {fence: 2, weight: 1}}}
	b := encodeBody(&o)
	got, ok := decodeBody(b)
	if !ok || len(got.holders) != 2 || got.holders[0].weight != 3 || got.holders[1].weight != 1 {
		t.Fatalf("decoded %+v (ok %v), want weights 3 and 1", got.holders, ok)
	}
	o.holders[0].weight = 1
	plain := encodeBody(&o)
	if len(plain) != len(b)-4 {
		t.Fatalf("a body of single permits is %d bytes, want %d: no weights", len(plain), len(b)-4)
	}
	if got, ok := decodeBody(plain); !ok || got.holders[0].weight != 1 || got.holders[1].weight != 1 {
		t.Fatalf("decoded %+v (ok %v), want weights 1", got.holders, ok)
	}
}

// List names a semaphore or read-write lock whose file name is shortened
// (a hash) by the key its body records, and one of an older version (no
// recorded key) not at all, until its next write records it.
func TestListObjectsLongKeys(t *testing.T) {
	d, err := New(t.TempDir(), WithSync(false))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	long := "ns/" + strings.Repeat("ü", 150)
	for _, m := range []backend.Mode{backend.Permit, backend.Read} {
		if !strings.Contains(filepath.Base(d.objectPath(long, m)), "~") {
			t.Fatal("the long key's file name is not shortened")
		}
		claims := []backend.Claim{
			{Key: long, Token: "t", TTL: time.Minute, Owner: "o", Mode: m, Limit: 2},
			{Key: "ns/short", Token: "t", TTL: time.Minute, Owner: "o", Mode: m, Limit: 2},
		}
		for _, c := range claims {
			if _, err := d.TryAcquire(ctx(t), c); err != nil {
				t.Fatal(err)
			}
		}
		keys := func() []string {
			t.Helper()
			got, err := d.List(ctx(t), "ns/", m)
			if err != nil {
				t.Fatal(err)
			}
			var ks []string
			for _, st := range got {
				if !st.Held || st.Mode != m || len(st.Holders) != 1 || st.Holders[0].Owner != "o" {
					t.Errorf("List(%v): %+v", m, st)
				}
				ks = append(ks, st.Key)
			}
			slices.Sort(ks)
			return ks
		}
		if got := keys(); !slices.Equal(got, []string{"ns/short", long}) {
			t.Fatalf("List(%v) = %q", m, got)
		}
		// The long key's file as an older version wrote it: no key.
		path := d.objectPath(long, m)
		f, err := openLocked(ctx(t), path, false)
		if err != nil {
			t.Fatal(err)
		}
		o, cur, err := d.readObject(f.File, path)
		if err == nil {
			o.key = ""
			err = d.writeObject(f.File, path, &o, cur)
		}
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := keys(); !slices.Equal(got, []string{"ns/short"}) {
			t.Fatalf("List(%v) of an older file = %q, want the short key only", m, got)
		}
		if err := d.Refresh(ctx(t), claims[0]); err != nil {
			t.Fatal(err)
		}
		if got := keys(); !slices.Equal(got, []string{"ns/short", long}) {
			t.Fatalf("List(%v) after a refresh = %q", m, got)
		}
		if got, err := d.List(ctx(t), "ns/", backend.Exclusive); err != nil || len(got) != 0 {
			t.Fatalf("List of locks = %+v, %v: no lock is held", got, err)
		}
	}
}
