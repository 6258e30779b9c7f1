// Package faultproxy is a TCP proxy for fault-injection tests: placed between
// clients and a real server on loopback, it passes bytes through, or
// blackholes, stalls, delays or cuts them on command.
//
// Every fault applies to the connections open at that moment and to those
// accepted later, until Heal. Faults act on the bytes, never on the TCP
// connections themselves (except Cut and Refuse): a blackholed connection
// stays open, with no RST and no FIN, as across a network partition.
package faultproxy

import (
	"errors"
	"net"
	"sync"
	"time"
)

// dialTimeout bounds the proxy's own connection to the target.
const dialTimeout = 2 * time.Second

// Proxy forwards connections from Addr to a target. Its methods are safe to
// call from many goroutines.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	st      state
	changed chan struct{} // closed and replaced whenever st changes
	links   map[*link]struct{}
	closed  bool
	cuts    int // Cuts so far, so that a connection being dialled learns of one
	stats   Stats

	wg sync.WaitGroup // every goroutine the proxy started
}

// state is the fault in force. Up is client to server, down the reverse.
type state struct {
	drop   [2]bool          // bytes silently discarded
	hold   [2]bool          // bytes kept back, delivered in order on Heal
	delay  [2]time.Duration // latency added to each chunk
	refuse bool             // new connections reset at once
}

// Directions, as indexes into state's arrays.
const (
	up   = 0 // client to server
	down = 1 // server to client
)

// Stats counts what the proxy did, for test reports.
type Stats struct {
	Accepted      int   // connections accepted and forwarded
	Refused       int   // connections reset at once (Refuse) or whose target did not answer
	Cut           int   // connections reset by Cut
	DroppedUp     int64 // bytes discarded client to server
	DroppedDown   int64 // bytes discarded server to client
	ForwardedUp   int64 // bytes delivered client to server
	ForwardedDown int64 // bytes delivered server to client
}

// New starts a proxy to target (host:port) listening on 127.0.0.1 on a free port.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		target:  target,
		ln:      ln,
		changed: make(chan struct{}),
		links:   make(map[*link]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port: point clients here.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the server's host:port.
func (p *Proxy) Target() string { return p.target }

// Blackhole silently drops every byte both ways, on open and new
// connections, until Heal. Connections stay open: no RST, no FIN.
func (p *Proxy) Blackhole() {
	p.update(func(s *state) { s.drop = [2]bool{true, true} })
}

// BlackholeUp drops the bytes from clients to the server only: the server
// no longer hears the client, which still hears what the server sends.
func (p *Proxy) BlackholeUp() { p.update(func(s *state) { s.drop[up] = true }) }

// BlackholeDown drops the bytes from the server to clients only: requests
// reach the server, which acts on them, but no answer comes back.
func (p *Proxy) BlackholeDown() { p.update(func(s *state) { s.drop[down] = true }) }

// Stall holds back every byte both ways, without dropping it, until Heal,
// which delivers what was held in order: a partition that TCP survives.
// Requests sent during a stall reach the server only after it.
func (p *Proxy) Stall() {
	p.update(func(s *state) { s.hold = [2]bool{true, true} })
}

// Delay adds latency to every chunk of bytes read from now on: up for
// client to server, down for server to client. Order is preserved.
func (p *Proxy) Delay(upDelay, downDelay time.Duration) {
	p.update(func(s *state) { s.delay = [2]time.Duration{upDelay, downDelay} })
}

// Refuse makes the proxy reset new connections at once (on) or accept them
// again (off). Open connections are not touched.
func (p *Proxy) Refuse(on bool) { p.update(func(s *state) { s.refuse = on }) }

// Heal ends every fault: open connections pass bytes again (those dropped
// are gone, those held are delivered), new ones are accepted.
func (p *Proxy) Heal() { p.update(func(s *state) { *s = state{} }) }

// Cut resets every open connection (RST to the client and to the server).
// New connections are accepted as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	ls := make([]*link, 0, len(p.links))
	for l := range p.links {
		ls = append(ls, l)
	}
	p.stats.Cut += len(ls)
	p.cuts++
	p.mu.Unlock()
	for _, l := range ls {
		l.reset()
	}
}

// Conns is how many connections are open through the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close stops listening, resets every connection and returns once every
// goroutine of the proxy has ended.
func (p *Proxy) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		p.wg.Wait()
		return nil
	}
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) update(f func(*state)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.st)
	close(p.changed)
	p.changed = make(chan struct{})
}

// snapshot returns the state in force and a channel closed when it changes.
func (p *Proxy) snapshot() (state, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st, p.changed
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary trouble (e.g. out of descriptors): back off briefly.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			resetConn(c)
			return
		}
		if p.st.refuse {
			p.stats.Refused++
			p.mu.Unlock()
			resetConn(c)
			continue
		}
		p.wg.Add(1)
		gen := p.cuts
		p.mu.Unlock()
		go p.connect(c, gen)
	}
}

// connect dials the target for an accepted client and starts forwarding.
// A connection accepted before a Cut or a Refuse that came while it was
// being dialled goes too: otherwise it would survive them.
func (p *Proxy) connect(client net.Conn, gen int) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		p.mu.Lock()
		p.stats.Refused++
		p.mu.Unlock()
		resetConn(client)
		return
	}
	l := &link{p: p, client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.st.refuse || p.cuts != gen {
		p.stats.Refused++
		p.mu.Unlock()
		resetConn(client)
		resetConn(server)
		return
	}
	p.links[l] = struct{}{}
	p.stats.Accepted++
	l.writers = 2
	p.wg.Add(4)
	p.mu.Unlock()
	l.start(up, client, server)
	l.start(down, server, client)
}

// resetConn closes c with an RST rather than a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
