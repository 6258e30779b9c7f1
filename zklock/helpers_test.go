package zklock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

// testTimeout is the session timeout of test drivers: the server's
// minimum is 1s; 2s keeps a busy machine from expiring sessions by accident.
const testTimeout = 2 * time.Second

// registry remembers the drivers a test made, so that Expire can find the
// one whose session owns a node and end that session.
type registry struct {
	mu      sync.Mutex
	drivers map[*Driver]*gate
}

func (r *registry) add(d *Driver, g *gate) {
	r.mu.Lock()
	if r.drivers == nil {
		r.drivers = map[*Driver]*gate{}
	}
	r.drivers[d] = g
	r.mu.Unlock()
}

func (r *registry) bySession(sid int64) (*Driver, *gate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for d, g := range r.drivers {
		if s, _ := g.spy.credentials(); s == sid {
			return d, g
		}
	}
	return nil, nil
}

// credentials returns the id and password of d's session; d must be one of
// the drivers made by dial.
func (r *registry) credentials(d *Driver) (int64, []byte) {
	r.mu.Lock()
	g := r.drivers[d]
	r.mu.Unlock()
	if g == nil {
		return 0, nil
	}
	return g.spy.credentials()
}

var drivers registry

// gate holds a driver's new connections back while it is shut, so that
// the driver cannot resume its session while a test expires it.
type gate struct {
	mu   sync.Mutex
	shut chan struct{} // nil when open
	spy  spy           // the session's credentials, for expireSession
}

func (g *gate) close() {
	g.mu.Lock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
	g.mu.Unlock()
}

func (g *gate) open() {
	g.mu.Lock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
	g.mu.Unlock()
}

// dialer is the gate's dialer, with its spy.
func (g *gate) dialer(network, addr string, timeout time.Duration) (net.Conn, error) {
	return g.spy.dialer(g.dial)(network, addr, timeout)
}

func (g *gate) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	g.mu.Lock()
	ch := g.shut
	g.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
		}
	}
	return net.DialTimeout(network, addr, timeout)
}

// dialDriver opens a test driver whose session expireKey can end.
func dialDriver(ctx context.Context, servers []string, opts ...Option) (*Driver, error) {
	g := &gate{}
	opts = append([]Option{WithSessionTimeout(testTimeout), WithRoot("/locker-test"), WithDialer(g.dialer)}, opts...)
	d, err := Dial(ctx, servers, opts...)
	if err != nil {
		return nil, err
	}
	drivers.add(d, g)
	return d, nil
}

func dial(t testing.TB, servers []string, opts ...Option) *Driver {
	t.Helper()
	testenv.Require(t, servers...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := dialDriver(ctx, servers, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newToken(testing.TB) string { return testutil.Token() }

// testNamespace is the namespace of uniqueKey's keys.
const testNamespace = "zklock-test"

func uniqueKey(t testing.TB) string {
	return testNamespace + "/" + t.Name() + "/" + newToken(t)[:8]
}

// nameOf is the name of a uniqueKey key, for a Client of clientOf's.
func nameOf(key string) string { return strings.TrimPrefix(key, testNamespace+"/") }

// clientOf is a Client over d, for tests of a whole wait: the driver
// queues (backend.Queuer), and the Client decides the rest (retries, the
// failure budget, a new node when one went with its session, leaving the
// queue when it gives up).
func clientOf(t testing.TB, d *Driver) *locker.Client {
	t.Helper()
	c, err := locker.New(d, locker.WithNamespace(testNamespace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// acquire takes l in d's queue as the Client drives a backend.Queuer, but
// without its retries: Enqueue, then Wait until the turn comes; the first
// failure ends it, and leaves the queue.
func acquire(ctx context.Context, d *Driver, l backend.Claim) (backend.Grant, error) {
	g, t, err := d.Enqueue(ctx, l)
	for t != nil && err == nil {
		if g, err = t.Wait(ctx); err == nil {
			return g, nil
		}
		if errors.Is(err, backend.ErrNotAcquired) {
			err = nil
		}
	}
	if t != nil && !errors.Is(err, backend.ErrRequeue) {
		t.Leave(context.WithoutCancel(ctx))
	}
	return g, err
}

// holderSession returns the session that owns the first node of key's
// queue, and the node's path.
func holderSession(conn *zk.Conn, d *Driver, key string) (int64, string, error) {
	// The lock's holder, else the semaphore's first, else the read-write
	// lock's.
	for _, parent := range objectParents(d, key) {
		// This connection's server may lag behind the one the holder
		// used: catch up with the leader first.
		if _, err := conn.Sync(parent); errors.Is(err, zk.ErrNoNode) {
			continue
		} else if err != nil {
			return 0, "", err
		}
		names, _, err := conn.Children(parent)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return 0, "", err
		}
		best, bestSeq := "", int64(-1)
		for _, n := range names {
			if _, _, seq, ok := parseTagged(n); ok && (bestSeq < 0 || seq < bestSeq) {
				best, bestSeq = n, seq
			}
		}
		if best == "" {
			continue
		}
		ok, st, err := conn.Exists(parent + "/" + best)
		if err != nil {
			return 0, "", err
		}
		if !ok {
			return 0, "", fmt.Errorf("holder node of %q went away", key)
		}
		return st.EphemeralOwner, parent + "/" + best, nil
	}
	return 0, "", fmt.Errorf("no holder of %q", key)
}

// objectParents are the nodes of key's lock, semaphore and read-write lock.
func objectParents(d *Driver, key string) []string {
	return []string{
		d.parentPath(key),
		d.queueParent(backend.Claim{Key: key, Mode: backend.Permit}),
		d.queueParent(backend.Claim{Key: key, Mode: backend.Read}),
	}
}

// expireSession ends a session on the server, as its expiry would: it
// connects with the session's id and password, from a second connection,
// and closes the session. The server deletes the session's ephemeral nodes
// and closes its connections; the owner learns of it when it reconnects.
func expireSession(servers []string, sid int64, passwd []byte) error {
	var lastErr error
	for _, addr := range servers {
		if err := closeSession(addr, sid, passwd); err != nil {
			lastErr = err
			continue
		}
		return nil
	}
	return lastErr
}

func closeSession(addr string, sid int64, passwd []byte) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	// ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd.
	req := make([]byte, 0, 64)
	req = binary.BigEndian.AppendUint32(req, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, uint32(testTimeout/time.Millisecond))
	req = binary.BigEndian.AppendUint64(req, uint64(sid))
	req = binary.BigEndian.AppendUint32(req, uint32(len(passwd)))
	req = append(req, passwd...)
	if err := writePacket(c, req); err != nil {
		return err
	}
	resp, err := readPacket(c)
	if err != nil {
		return fmt.Errorf("connect as session %#x: %w", sid, err)
	}
	if len(resp) < 16 {
		return fmt.Errorf("short connect response")
	}
	if got := int64(binary.BigEndian.Uint64(resp[8:16])); got == 0 {
		return nil // already expired
	} else if got != sid {
		return fmt.Errorf("server gave session %#x, not %#x", got, sid)
	}
	// closeSession: xid 1, opcode -11.
	close := binary.BigEndian.AppendUint32(nil, 1)
	close = binary.BigEndian.AppendUint32(close, uint32(0xfffffff5))
	if err := writePacket(c, close); err != nil {
		return err
	}
	for {
		resp, err := readPacket(c)
		if errors.Is(err, io.EOF) {
			return nil // servers may hang up without answering a closeSession
		}
		if err != nil {
			return fmt.Errorf("close session %#x: %w", sid, err)
		}
		if len(resp) >= 16 && int32(binary.BigEndian.Uint32(resp[0:4])) == 1 {
			if code := int32(binary.BigEndian.Uint32(resp[12:16])); code != 0 {
				return fmt.Errorf("close session %#x: error %d", sid, code)
			}
			return nil
		}
	}
}

func writePacket(w io.Writer, b []byte) error {
	_, err := w.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...))
	return err
}

func readPacket(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(n[:]))
	_, err := io.ReadFull(r, b)
	return b, err
}

// expireKey ends the session of key's holder, which must be one of the
// drivers made by dial.
func expireKey(ctx context.Context, servers []string, d *Driver, key string) error {
	sid, _, err := holderSession(d.conn, d, key)
	if err != nil {
		return err
	}
	owner, g := drivers.bySession(sid)
	if owner == nil {
		return fmt.Errorf("session %#x of %q's holder is none of ours", sid, key)
	}
	s, passwd := g.spy.credentials()
	if s != sid {
		return fmt.Errorf("session changed")
	}
	// Shut the owner's gate: when the server drops its connection on our
	// connect with its session, it must not come back before we close it.
	g.close()
	defer g.open()
	var lastErr error
	for range 5 {
		if err := expireSession(servers, sid, passwd); err != nil {
			lastErr = err
		}
		// Wait until the server has deleted the node.
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
			s2, _, err := holderSession(d.conn, d, key)
			if err != nil || s2 != sid {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if lastErr == nil {
		lastErr = ctx.Err()
	}
	return fmt.Errorf("session %#x did not end: %v", sid, lastErr)
}

func lockFor(t testing.TB, key string) backend.Claim {
	return backend.Claim{Key: key, Token: newToken(t), TTL: time.Second}
}
