package sqldb

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/testutil"
	"github.com/lockerhq/locker/sqllock/internal/sqltest"
)

// counted is a connection that counts the packets the client sends: one
// per command, so one per round trip.
type counted struct {
	net.Conn
	n *atomic.Int64
}

func (c counted) Write(b []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(b)
}

// mysqlCounted is a driver on a pool of its own, with a Client on it, and
// the count of packets its connections sent.
func mysqlCounted(tb testing.TB) (*Driver, *locker.Client, *atomic.Int64) {
	tb.Helper()
	sent := new(atomic.Int64)
	cfg := sqltest.MySQLConfig(tb)
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return counted{nc, sent}, nil
	}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxIdleConns(16) // as the opener's
	tb.Cleanup(func() { db.Close() })
	h := sqltest.NewMySQL(tb, func(ctx context.Context, table string) (backend.Driver, error) {
		return New(db, MySQL, WithTable(table))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drv, err := h.NewDriver(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	d := drv.(*Driver)
	c, err := locker.New(d, locker.WithNamespace("rt"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	if err := d.ensureSchema(ctx); err != nil {
		tb.Fatal(err)
	}
	return d, c, sent
}

// An uncontended cycle on MySQL is two round trips, as the raw floor's:
// the grant's statement and the release's, nothing else (no version read,
// no wake-up written, no prepare once the connection has the statements),
// through the driver and through the Client alike.
func TestCycleRoundTrips(t *testing.T) {
	t.Parallel()
	d, c, sent := mysqlCounted(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cycles := map[string]func(i int) error{
		"driver": func(i int) error {
			l := backend.Claim{Key: fmt.Sprintf("rt/d-%d", i), Token: testutil.Token(), TTL: time.Minute}
			g, err := d.TryAcquire(ctx, l)
			if err != nil {
				return err
			}
			l.Fence = g.Fence
			return d.Release(ctx, l)
		},
		"client": func(i int) error {
			l, err := c.TryAcquire(ctx, fmt.Sprintf("c-%d", i))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
		"floor": func(i int) error { return d.rawFloor(ctx, fmt.Sprintf("rt/f-%d", i)) },
	}
	for name, cycle := range cycles {
		for i := range 5 { // the connection prepares the statements
			if err := cycle(-1 - i); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		const n = 50
		before := sent.Load()
		for i := range n {
			if err := cycle(i); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		if got := sent.Load() - before; got != 2*n {
			t.Errorf("%s: %d cycles sent %d packets, want %d (2 round trips a cycle)", name, n, got, 2*n)
		}
	}
}

// BenchmarkUncontendedBreakdown is lockctl bench's uncontended comparison
// on MySQL (one goroutine, a new name per operation, the subjects in
// alternating blocks, ratios taken per round), with the steps between the
// raw floor and the Client apart: the floor's statements on a context
// that cannot end (so without go-sql-driver's watcher: "floor-bare"), the
// grant's and release's prepared statements so ("stmts-bare") and on the
// driver's cancellable context ("stmts"), the same with the grant detached
// as Driver.write runs it ("stmts-detached"), the driver's cycle, the
// Client's TryAcquire + Release. Each one's p50 and the process's CPU time
// per cycle over the floor's, median [min–max] over 12 rounds.
//
//	go test -run '^$' -bench UncontendedBreakdown -benchtime 1x ./sqllock/sqldb
func BenchmarkUncontendedBreakdown(b *testing.B) {
	d, c, _ := mysqlCounted(b)
	ctx := context.Background()
	var seq atomic.Int64
	next := func(p string) string { return fmt.Sprintf("bench/%s-%d", p, seq.Add(1)) }
	us := int64(6 * time.Second / time.Microsecond)
	exec := func(ctx context.Context, q string, args ...any) (int64, error) {
		res, err := on{ctx, d, nil}.exec(q, args...)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	// stmts runs the grant's statement through grant, then the release's.
	stmts := func(ctx context.Context, grant func(f func(context.Context) error) error) error {
		key, token := next("stmts"), testutil.Token()
		var fence int64
		err := grant(func(ctx context.Context) (err error) {
			fence, err = exec(ctx, d.sql.insert, key, token, "", us)
			return err
		})
		if err != nil {
			return err
		}
		_, err = exec(ctx, d.sql.release, key, token, fence, fence)
		return err
	}
	inline := func(f func(context.Context) error) error { return f(ctx) }
	entered := func(grant func(ctx context.Context, f func(context.Context) error) error) func(context.Context, int) error {
		return func(context.Context, int) error {
			ctx, leave, err := d.begin(ctx, "bench")
			if err != nil {
				return err
			}
			defer leave()
			return stmts(ctx, func(f func(context.Context) error) error { return grant(ctx, f) })
		}
	}
	names := []string{"floor", "floor-bare", "stmts-bare", "stmts", "stmts-detached", "driver", "client"}
	ops := []func(context.Context, int) error{
		func(context.Context, int) error { return d.rawFloor(ctx, next("floor")) },
		func(context.Context, int) error {
			key, token := next("bare"), testutil.Token()
			if _, err := exec(ctx, d.sql.floorInsert, key, token); err != nil {
				return err
			}
			_, err := exec(ctx, d.sql.floorDelete, key, token)
			return err
		},
		func(context.Context, int) error { return stmts(ctx, inline) },
		entered(func(ctx context.Context, f func(context.Context) error) error { return f(ctx) }),
		entered(func(ctx context.Context, f func(context.Context) error) error {
			return d.write(ctx, f, func(context.Context) error { return nil })
		}),
		func(context.Context, int) error {
			l := backend.Claim{Key: next("driver"), Token: testutil.Token(), TTL: 6 * time.Second}
			g, err := d.TryAcquire(ctx, l)
			if err != nil {
				return err
			}
			l.Fence = g.Fence
			return d.Release(ctx, l)
		},
		func(context.Context, int) error {
			l, err := c.TryAcquire(ctx, next("client"))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
	}
	for b.Loop() {
		rounds, err := bench.Interleave(ctx, 1, 12, 60*time.Millisecond, ops...)
		if err != nil {
			b.Fatal(err)
		}
		p50 := func(r bench.Round) float64 { return float64(r.P50()) }
		for j, name := range names {
			lat, cpu := bench.Ratio(rounds[j], rounds[0], p50), bench.Ratio(rounds[j], rounds[0], bench.CPUPerCycle)
			b.Logf("%-14s p50 %4dµs  /floor %.2f [%.2f–%.2f]  cpu/floor %.2f", name, bench.RateOf(rounds[j]).P50.Microseconds(), lat.Median, lat.Min, lat.Max, cpu.Median)
		}
	}
}
