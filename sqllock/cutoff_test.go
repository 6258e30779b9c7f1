package sqllock

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/faultproxy"
)

// Faults from a TCP proxy in front of the test database: a blackhole is a
// connection that stays open and never answers, as across a partition.

// proxied starts a fault proxy to rawURL's server and returns it with
// rawURL pointing at it.
func proxied(t *testing.T, rawURL string) (*faultproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, viaProxy(t, rawURL, p)
}

// viaProxy returns rawURL pointing at p.
func viaProxy(t *testing.T, rawURL string, p *faultproxy.Proxy) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr()
	return u.String()
}

// labeled returns the stacks of the goroutines labelled test=id: those
// started, directly or not, inside pprof.Do with that label.
func labeled(id string) []string {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	var out []string
	for _, rec := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(rec, `"test":"`+id+`"`) {
			out = append(out, rec)
		}
	}
	return out
}

// leftBehind waits up to d for the labelled goroutines to end and returns
// those still running.
func leftBehind(id string, d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		left := labeled(id)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// conns records the connections of a pool the test builds, so that the
// test can cut them itself.
type conns struct {
	mu  sync.Mutex
	cs  []net.Conn
	cut bool
}

func (c *conns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		nc.Close()
		return nil, errors.New("cut by the test")
	}
	c.cs = append(c.cs, nc)
	return nc, nil
}

// cutAll closes every connection and refuses new ones.
func (c *conns) cutAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = true
	for _, nc := range c.cs {
		nc.Close()
	}
}

// Close of a driver cut off from the server returns within 2 s, and calls
// in flight then return. With its own pool (Open), nothing of the driver or
// of pgx is left running; with the caller's pool (New), nothing once the
// caller's own connections are gone. (Before: with the caller's pool, a
// call in flight stayed blocked until its own context ended.)
func TestCloseCutOff(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"open", "new"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			p, purl := proxied(t, h.url)
			var users conns
			id := "close-" + mode + "-" + randHex(4)
			var userPool *pgxpool.Pool
			if mode == "new" {
				// The caller's pool, and so the listener, which copies
				// its configuration, go through the proxy. Its own
				// goroutines are not labelled.
				cfg, err := pgxpool.ParseConfig(viaProxy(t, baseURL(t), p))
				if err != nil {
					t.Fatal(err)
				}
				cfg.ConnConfig.DialFunc = users.dial
				if userPool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(userPool.Close)
			}
			pprof.Do(context.Background(), pprof.Labels("test", id), func(ctx context.Context) {
				var d *Driver
				var err error
				if mode == "open" {
					d, err = Open(ctx, purl)
				} else {
					d, err = New(userPool, WithTable(h.sql.table[1:len(h.sql.table)-1]))
				}
				if err != nil {
					t.Fatal(err)
				}
				l := backend.Claim{Key: "cut/x", Token: randHex(16), TTL: time.Minute}
				g, err := d.TryAcquire(ctx, l)
				if err != nil {
					t.Fatal(err)
				}
				l.Fence = g.Fence
				_, unsub, err := d.Subscribe(ctx, "cut/y") // the listener runs
				if err != nil {
					t.Fatal(err)
				}
				defer unsub()

				p.Blackhole()
				flight := make(chan error, 1)
				go func() {
					cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					flight <- d.Refresh(cctx, l)
				}()
				time.Sleep(200 * time.Millisecond) // the refresh waits for its answer
				start := time.Now()
				if err := d.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if took := time.Since(start); took > 2*time.Second {
					t.Errorf("Close took %v cut off, want at most 2s", took)
				} else {
					t.Logf("Close took %v cut off", took)
				}
				select {
				case err := <-flight:
					if !errors.Is(err, backend.ErrClosed) {
						t.Errorf("the refresh in flight at Close returned %v, want ErrClosed", err)
					}
					t.Logf("the refresh in flight returned %v after Close", time.Since(start))
				case <-time.After(2 * time.Second):
					t.Errorf("the refresh in flight at Close still blocks 2s later")
				}
			})
			if mode == "new" {
				users.cutAll() // what is left of the caller's pool is the caller's
			}
			if left := leftBehind(id, 2*time.Second); len(left) > 0 {
				t.Errorf("%d goroutines left 2s after Close:\n%s", len(left), strings.Join(left, "\n\n"))
			}
		})
	}
}
