package faultproxy_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/faultproxy"
)

// echoServer echoes every connection on loopback and counts the bytes it
// received; it stops with the test.
type echoServer struct {
	ln       net.Listener
	mu       sync.Mutex
	received int
	conns    []net.Conn
	wg       sync.WaitGroup
}

func newEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						e.mu.Lock()
						e.received += n
						e.mu.Unlock()
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		e.mu.Lock()
		for _, c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func (e *echoServer) Received() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.received
}

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// expectClosed dials addr and expects the connection to end at once: the
// dial fails, or the first read gets EOF or a reset.
func expectClosed(t *testing.T, addr string, within time.Duration) {
	t.Helper()
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, within)
	if err == nil {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(within))
		_, err = c.Read(make([]byte, 1))
		if err == nil || isTimeout(err) {
			t.Fatalf("read: %v, want EOF or a reset", err)
		}
	}
	if d := time.Since(start); d > within {
		t.Fatalf("connection ended after %v, want within %v", d, within)
	}
}

// roundTrip writes msg and reads its echo within d.
func roundTrip(c net.Conn, msg string, d time.Duration) error {
	c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo mismatch: " + string(buf))
	}
	return nil
}

// isTimeout reports a deadline error: the connection is open but silent.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestPassThrough(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	for i := 0; i < 10; i++ {
		if err := roundTrip(c, "hello", 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	big := strings.Repeat("x", 1<<20)
	if err := roundTrip(c, big, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestBlackholeKeepsConnectionsOpenAndSilent(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	if err := roundTrip(c, "warm", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	before := e.Received()
	p.Blackhole()
	// The write succeeds, nothing comes back, and the connection is not
	// closed: the read times out, no EOF, no reset.
	err := roundTrip(c, "lost", 300*time.Millisecond)
	if !isTimeout(err) {
		t.Fatalf("blackholed round trip: %v, want a timeout", err)
	}
	if got := e.Received(); got != before {
		t.Fatalf("server received %d bytes through a blackhole", got-before)
	}
	// A new connection is accepted but equally silent.
	c2 := dial(t, p.Addr())
	if err := roundTrip(c2, "new", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection under blackhole: %v, want a timeout", err)
	}
	if st := p.Stats(); st.DroppedUp < int64(len("lostnew")) {
		t.Fatalf("stats: %+v, want dropped bytes counted", st)
	}
	p.Heal()
	// The dropped bytes are gone; the stream passes again.
	if err := roundTrip(c2, "back", 2*time.Second); err != nil {
		t.Fatalf("after heal: %v", err)
	}
}

func TestBlackholeOneWay(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())

	c := dial(t, p.Addr())
	p.BlackholeDown()
	before := e.Received()
	if err := roundTrip(c, "req", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("down blackholed: %v, want a timeout", err)
	}
	if got := e.Received() - before; got != 3 {
		t.Fatalf("down blackholed: server received %d bytes, want 3 (requests still arrive)", got)
	}
	p.Heal()

	c2 := dial(t, p.Addr())
	p.BlackholeUp()
	before = e.Received()
	if err := roundTrip(c2, "req", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("up blackholed: %v, want a timeout", err)
	}
	if got := e.Received() - before; got != 0 {
		t.Fatalf("up blackholed: server received %d bytes", got)
	}
}

func TestStallDeliversOnHeal(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	p.Stall()
	if err := roundTrip(c, "held", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("stalled: %v, want a timeout", err)
	}
	if got := e.Received(); got != 0 {
		t.Fatalf("server received %d bytes during a stall", got)
	}
	p.Heal()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after heal: %q, %v; want the held bytes", buf, err)
	}
}

func TestDelayPerDirectionKeepsOrder(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	const upD, downD = 60 * time.Millisecond, 40 * time.Millisecond
	p.Delay(upD, downD)
	start := time.Now()
	if err := roundTrip(c, "x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < upD+downD {
		t.Fatalf("round trip %v under delay %v+%v", rtt, upD, downD)
	} else {
		t.Logf("round trip %v under delay %v+%v", rtt, upD, downD)
	}
	// Many small writes come back in order.
	var want bytes.Buffer
	for i := 0; i < 200; i++ {
		want.WriteString(string(rune('a' + i%26)))
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	go func() {
		for _, b := range want.Bytes() {
			c.Write([]byte{b})
		}
	}()
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("order lost under delay: %q", got)
	}
}

func TestCutResetsOpenConnections(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	if err := roundTrip(c, "warm", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	if err == nil || isTimeout(err) {
		t.Fatalf("read after cut: %v, want a reset", err)
	}
	// New connections work.
	c2 := dial(t, p.Addr())
	if err := roundTrip(c2, "again", 2*time.Second); err != nil {
		t.Fatalf("after cut: %v", err)
	}
	if st := p.Stats(); st.Cut != 1 {
		t.Fatalf("stats: %+v, want 1 cut", st)
	}
}

func TestRefuse(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	open := dial(t, p.Addr())
	if err := roundTrip(open, "warm", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	expectClosed(t, p.Addr(), time.Second)
	// Open connections are not touched.
	if err := roundTrip(open, "still", 2*time.Second); err != nil {
		t.Fatalf("open connection under refuse: %v", err)
	}
	p.Refuse(false)
	if err := roundTrip(dial(t, p.Addr()), "ok", 2*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestTargetDownResetsClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := newProxy(t, addr)
	expectClosed(t, p.Addr(), 3*time.Second)
}

func TestCloseLeavesNoGoroutine(t *testing.T) {
	e := newEcho(t)
	p, err := faultproxy.New(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for i := 0; i < 5; i++ {
		c := dial(t, p.Addr())
		if err := roundTrip(c, "x", 2*time.Second); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Every kind of pending work at once: a stalled chunk, a delayed chunk,
	// a blocked writer.
	p.Delay(time.Hour, 0)
	io.WriteString(conns[0], "delayed")
	p.Stall()
	io.WriteString(conns[1], "held")
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v", d)
	}
	checkNoProxyGoroutines(t)
	// Clients see their connections end.
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("client read after Close: %v", err)
		}
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("the proxy still accepts after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// checkNoProxyGoroutines fails if a goroutine runs code of this package.
func checkNoProxyGoroutines(t *testing.T) {
	t.Helper()
	var stacks string
	for i := 0; i < 100; i++ {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "internal/faultproxy.(") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	os.Stderr.WriteString(stacks)
	t.Fatal("faultproxy goroutines left after Close")
}
