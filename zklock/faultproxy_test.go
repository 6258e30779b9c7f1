package zklock

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxy is a TCP proxy in front of one server, for fault tests on
// loopback: it can blackhole either direction (bytes are read and
// dropped, nothing is closed, as when packets are lost) and cut every
// connection. A blackhole applies to new connections too.
//
// A stand-in until internal/faultproxy lands.
type proxy struct {
	ln     net.Listener
	target string
	up     atomic.Bool // drop client-to-server bytes
	down   atomic.Bool // drop server-to-client bytes

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// blackhole sets which directions drop their bytes.
func (p *proxy) blackhole(up, down bool) { p.up.Store(up); p.down.Store(down) }

// cut closes every connection open now.
func (p *proxy) cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, s) {
			c.Close()
			s.Close()
			return
		}
		p.wg.Add(2)
		go p.pump(s, c, &p.up)
		go p.pump(c, s, &p.down)
	}
}

// pump copies src to dst until either fails, dropping bytes while drop is
// set; it ends when the connections close.
func (p *proxy) pump(dst, src net.Conn, drop *atomic.Bool) {
	defer p.wg.Done()
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !drop.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
