package memcachelock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// The locker package tries a refused token again, and claim keeps an item
// that holds its token: a refusal that backed out (a reader that found a
// writer, a writer that found readers) must not answer before its undo is
// done, or the undo, landing after the retry's grant, frees it, and the
// other side gets in beside the holder. The undo's gets is held back here
// past CancelGrace, as a slow connection would.
func TestRefusalWaitsForItsUndo(t *testing.T) {
	testenv.Require(t, testenv.MemcacheAddr())
	for _, mode := range []backend.Mode{backend.Read, backend.Write} {
		t.Run(mode.String(), func(t *testing.T) { testRefusalWaitsForItsUndo(t, mode) })
	}
}

func testRefusalWaitsForItsUndo(t *testing.T, mode backend.Mode) {
	ctx := testCtx(t, 30*time.Second)
	other := backend.Write
	if mode == backend.Write {
		other = backend.Read
	}
	key := uniqueKey(t, "x")
	c := backend.Claim{Key: key, Token: token(), TTL: 10 * time.Second, Mode: mode}
	item := objKey(key, "w") // our item: the writer's
	if mode == backend.Read {
		keys, pref, _ := slots(c)
		item = keys[pref]
	}
	b := openDriver(t, testenv.MemcacheAddr())
	o := backend.Claim{Key: key, Token: token(), TTL: 10 * time.Second, Mode: other}
	// A takes its item, then finds o's: a reader looks for a writer before
	// it adds its slot, so o comes in just before that add.
	var backedOut atomic.Bool
	const held = 4 * backend.CancelGrace
	var hook atomic.Pointer[func(string)]
	mc := memcache.New(testenv.MemcacheAddr())
	mc.Timeout = 5 * time.Second // the held-back request must not time out
	mc.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := new(net.Dialer).DialContext(ctx, network, addr)
		return cmdConn{c, &hook}, err
	}
	t.Cleanup(func() { mc.Close() })
	a := mustNew(t, mc)
	f := func(cmd string) {
		switch {
		case mode == backend.Read && strings.HasPrefix(cmd, "add "+item+" "):
			if _, err := b.TryAcquire(ctx, o); err != nil {
				t.Error(err)
			}
		case strings.HasPrefix(cmd, "gets "+item+"\r\n") && !backedOut.Swap(true):
			time.Sleep(held) // the undo's first request
		}
	}
	hook.Store(&f)
	if mode == backend.Write {
		if _, err := b.TryAcquire(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.TryAcquire(ctx, c); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%v) beside a %v = %v, want ErrNotAcquired", mode, other, err)
	}
	hook.Store(nil)
	if !backedOut.Load() {
		t.Fatal("the refusal did not back out")
	}
	if err := b.Release(ctx, o); err != nil {
		t.Fatal(err)
	}
	// The retry of the same token, as the locker package's wait makes.
	if _, err := a.TryAcquire(ctx, c); err != nil {
		t.Fatalf("TryAcquire(%v) again, the %v gone: %v", mode, other, err)
	}
	time.Sleep(held + time.Second) // any undo still running is done
	if err := a.Refresh(ctx, c); err != nil {
		t.Fatalf("Refresh of the %v granted on the retry: %v (an undo of the refused try freed it)", mode, err)
	}
	o2 := backend.Claim{Key: key, Token: token(), TTL: 10 * time.Second, Mode: other}
	if _, err := b.TryAcquire(ctx, o2); !errors.Is(err, backend.ErrNotAcquired) {
		t.Fatalf("a %v beside the %v held = %v, want ErrNotAcquired", other, mode, err)
	}
	_ = b.Release(ctx, o2) // a refused writer's record of waiting
	if err := a.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
}

// cmdConn calls *f, if set, with each request before it sends it.
type cmdConn struct {
	net.Conn
	f *atomic.Pointer[func(string)]
}

func (c cmdConn) Write(b []byte) (int, error) {
	if f := c.f.Load(); f != nil {
		(*f)(string(b))
	}
	return c.Conn.Write(b)
}
