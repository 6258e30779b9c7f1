package zklock

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/testenv"
)

// opCounter counts the requests a connection sends, by opcode.
type opCounter struct {
	mu  sync.Mutex
	ops map[int32]int
}

func (o *opCounter) dialer(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, o: o}, nil
}

func (o *opCounter) snapshot() map[int32]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[int32]int, len(o.ops))
	for k, v := range o.ops {
		m[k] = v
	}
	return m
}

type countingConn struct {
	net.Conn
	o *opCounter
}

// Write sees one request per call (the zk client writes each whole):
// length, xid, opcode.
func (c *countingConn) Write(p []byte) (int, error) {
	if len(p) >= 12 {
		c.o.mu.Lock()
		if c.o.ops == nil {
			c.o.ops = map[int32]int{}
		}
		c.o.ops[int32(binary.BigEndian.Uint32(p[8:12]))]++
		c.o.mu.Unlock()
	}
	return c.Conn.Write(p)
}

// An uncontended acquire+release on a new name costs one multi-op (the
// name's node and the queue node together) and one delete: no separate
// create of the name's node, no listing, no failed first try.
func TestFreshNameRequests(t *testing.T) {
	t.Parallel()
	const (
		opCreate          = 1
		opDelete          = 2
		opGetChildren     = 8
		opGetChildren2    = 12
		opMulti           = 14
		opCreateContainer = 19
	)
	var o opCounter
	d := dial(t, testenv.ZKAddrs(), WithDialer(o.dialer))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 3 {
		l := lockFor(t, uniqueKey(t))
		before := o.snapshot()
		g, err := d.Acquire(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		mid := o.snapshot()
		l.Fence = g.Fence
		path, first, err := d.lookup(ctx, l)
		if err != nil || !first {
			t.Fatalf("cycle %d: node %q first %v: %v", i, path, first, err)
		}
		_, st, err := d.conn.Exists(path)
		if err != nil || uint64(st.Czxid) != g.Fence || st.EphemeralOwner != d.conn.SessionID() {
			t.Fatalf("cycle %d: fence %d, node %+v: %v", i, g.Fence, st, err)
		}
		beforeRelease := o.snapshot()
		if err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		after := o.snapshot()
		sent := func(op int32) int { return mid[op] - before[op] }
		if sent(opMulti) != 1 || sent(opCreate)+sent(opCreateContainer) != 0 || sent(opGetChildren)+sent(opGetChildren2) != 0 {
			t.Errorf("cycle %d: acquire sent %d multi-ops, %d creates, %d listings; want 1, 0, 0", i,
				sent(opMulti), sent(opCreate)+sent(opCreateContainer), sent(opGetChildren)+sent(opGetChildren2))
		}
		if n := after[opDelete] - beforeRelease[opDelete]; n != 1 {
			t.Errorf("cycle %d: release sent %d deletes, want 1", i, n)
		}
	}
}
