package memcachelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// A memcached restarted forgets every lock while their holders still run,
// each until its TTL after its last refresh: granting a name sooner could
// make two holders. So, as Redlock asks of a restarted server, a server
// that started less than a TTL ago grants no name whose fence counter it
// lacks. The counter is missing after a restart, on a name's first use and
// after an eviction; only then does the driver check the server's uptime,
// on a connection of its own (gomemcache has no stats call; see probes),
// which also carries the seed's add. A name's first use on a new server
// therefore waits for the server to have run for the TTL.
//
// It needs the server list, so it is on for drivers made by Open; a Driver
// made by New from the caller's client cannot find the key's server. With
// several servers, a name's counter and its lock item may live on different
// ones: the check then covers the restart of the counter's server only.

// uptimeSkew is how much memcached's reported uptime exceeds the time since
// it started: it counts from two seconds before its start (its clock,
// current_time, starts at ITEM_UPDATE_INTERVAL + 2 and uptime is
// current_time - ITEM_UPDATE_INTERVAL).
const uptimeSkew = 2 * time.Second

// probes are the driver's own connections to each server, for the
// restart check. A connection reads the server's uptime once, when it is
// made (stats), and keeps the latest time the server can have started.
// Later checks on it cost no stats: the seed's add itself is sent on it,
// and its reply proves that the process which stored the seed is the one
// whose start was read. A TCP connection does not outlive the process at
// its other end: after a restart, a request on it fails (a reset or end
// of file, never a reply), and the driver retries on a new connection,
// which reads the uptime again. So no uptime is trusted past the
// connection it was read on, and every check reaches the server.
type probes struct {
	mu     sync.Mutex
	idle   map[string][]*probe // by server address
	closed bool
}

type probe struct {
	c       net.Conn
	r       *bufio.Reader
	started time.Time // the server started at this time or before
}

// seed stores the counter fk with value seed (add, expiration exp) on the
// server that holds fk, if that server has run for ttl (capped by
// WithRestartDelay): else it returns an error wrapping ErrNotAcquired.
// stored says whether our add created the counter. Without a server list
// (New) it only adds.
func (d *Driver) seed(fk, seed string, exp int32, ttl time.Duration) (stored bool, err error) {
	if d.restartMax >= 0 {
		ttl = min(ttl, d.restartMax)
	}
	if d.servers == nil || ttl <= 0 {
		err := d.add(&memcache.Item{Key: fk, Value: []byte(seed), Expiration: exp})
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, memcache.ErrNotStored):
			return false, nil
		}
		return false, fmt.Errorf("memcachelock: fence: seed: %w", err)
	}
	addr, err := d.servers.PickServer(fk)
	if err != nil {
		return false, fmt.Errorf("memcachelock: %w", err)
	}
	cmd := "add " + fk + " 0 " + strconv.Itoa(int(exp)) + " " + strconv.Itoa(len(seed)) + "\r\n" + seed + "\r\n"
	for fresh := false; ; fresh = true {
		p, reused, err := d.probe(addr, fresh)
		if err != nil {
			return false, fmt.Errorf("memcachelock: uptime: %w", err)
		}
		if up := time.Since(p.started); up < ttl {
			d.putProbe(addr, p)
			return false, fmt.Errorf("memcachelock: %w", &backend.NotAcquiredError{Reason: fmt.Sprintf(
				"the server started less than a TTL ago and may have forgotten a holder; it grants this name in %v", (ttl - up).Round(time.Millisecond))})
		}
		line, err := p.call(d.timeout(), cmd)
		if err != nil {
			p.c.Close()
			if reused && staleConn(err) {
				continue // an idle connection the server closed (a restart): check again on a new one
			}
			return false, fmt.Errorf("memcachelock: fence: seed: %w", err)
		}
		d.putProbe(addr, p)
		switch line {
		case "STORED":
			return true, nil
		case "NOT_STORED":
			return false, nil
		}
		return false, fmt.Errorf("memcachelock: fence: seed: unexpected reply %q", line)
	}
}

// probe returns an idle connection to addr, or (fresh, or none idle) a new
// one that has read the server's uptime.
func (d *Driver) probe(addr net.Addr, fresh bool) (p *probe, reused bool, err error) {
	ps := &d.probes
	if !fresh {
		ps.mu.Lock()
		if q := ps.idle[addr.String()]; len(q) > 0 {
			p = q[len(q)-1]
			ps.idle[addr.String()] = q[:len(q)-1]
		}
		ps.mu.Unlock()
		if p != nil {
			return p, true, nil
		}
	}
	timeout := d.timeout()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var c net.Conn
	if d.mc.DialContext != nil {
		c, err = d.mc.DialContext(ctx, addr.Network(), addr.String())
	} else {
		var nd net.Dialer
		c, err = nd.DialContext(ctx, addr.Network(), addr.String())
	}
	if err != nil {
		return nil, false, err
	}
	p = &probe{c: c, r: bufio.NewReader(c)}
	up, err := p.uptime(timeout)
	if err != nil {
		c.Close()
		return nil, false, err
	}
	p.started = time.Now().Add(-up)
	return p, false, nil
}

// putProbe keeps p for the next check, up to the client's idle limit.
func (d *Driver) putProbe(addr net.Addr, p *probe) {
	ps := &d.probes
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed || len(ps.idle[addr.String()]) >= d.maxIdle() {
		p.c.Close()
		return
	}
	if ps.idle == nil {
		ps.idle = map[string][]*probe{}
	}
	ps.idle[addr.String()] = append(ps.idle[addr.String()], p)
}

// close closes the idle connections; those in use close when put back.
func (ps *probes) close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.closed = true
	for _, q := range ps.idle {
		for _, p := range q {
			p.c.Close()
		}
	}
	ps.idle = nil
}

// call sends cmd and reads one reply line, within timeout.
func (p *probe) call(timeout time.Duration, cmd string) (string, error) {
	if err := p.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(p.c, cmd); err != nil {
		return "", err
	}
	line, err := p.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// uptime asks the server for its uptime, within timeout, less uptimeSkew.
func (p *probe) uptime(timeout time.Duration) (time.Duration, error) {
	line, err := p.call(timeout, "stats\r\n")
	up := time.Duration(-1)
	for ; err == nil && line != "END"; line, err = p.line() {
		if s, ok := strings.CutPrefix(line, "STAT uptime "); ok {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("unexpected %q", line)
			}
			up = time.Duration(n)*time.Second - uptimeSkew
		}
	}
	if err != nil {
		return 0, err
	}
	if up == -1 {
		return 0, fmt.Errorf("no uptime in the server's stats")
	}
	return up, nil
}

// line reads the next reply line (the deadline call set still holds).
func (p *probe) line() (string, error) {
	line, err := p.r.ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}
