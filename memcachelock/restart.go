package memcachelock

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// A restarted memcached has forgotten every lock while their holders still
// run, so a server that started less than a TTL ago grants no name whose
// fence counter it lacks (seed); only drivers made by Open, which know the
// server list, check. See docs/backends/memcachelock.md, "Restarts".

// uptimeSkew is how much memcached's uptime exceeds the time since it
// started: its current_time starts at ITEM_UPDATE_INTERVAL + 2, and uptime
// is current_time - ITEM_UPDATE_INTERVAL.
const uptimeSkew = 2 * time.Second

// probes are the driver's own connections to each server, for the restart
// check, the pipelined requests and RefreshMany. A connection reads the
// server's uptime once, and the seed's add goes on it: a TCP connection does
// not outlive a restarted server, so the server that stored the seed is the
// one whose start was read.
type probes struct {
	mu     sync.Mutex
	idle   map[string][]*probe // by server address
	open   map[string]int      // idle and in use, by server address
	closed bool
	dials  atomic.Int64 // connections dialled, for tests
}

// errBusy: every probe to the server is in use (they are capped at the
// client's idle limit, so that concurrent calls do not dial one each), and
// the caller can take gomemcache's path instead.
var errBusy = errors.New("memcachelock: every probe connection is in use")

type probe struct {
	net.Conn
	r       *bufio.Reader
	started time.Time // the server started at this time or before; zero: not read yet
}

// checkTTL is how long a server must have run before it seeds a counter
// (see seed), 0 if the driver does not check.
func (d *Driver) checkTTL(ttl time.Duration) time.Duration {
	if d.restartMax >= 0 {
		ttl = min(ttl, d.restartMax)
	}
	if d.servers == nil || ttl <= 0 {
		return 0
	}
	return ttl
}

// seed adds the counter fk with the clock (expiring after the retention) if
// its server has run for ttl (capped by WithRestartDelay), else returns an
// error wrapping ErrNotAcquired. stored says whether our add created the
// counter, making v our fence. A non-empty lk, on fk's server, is read after
// the add (cur, nil if missing). Without a server list (New) it only adds.
func (d *Driver) seed(fk, lk string, ttl time.Duration) (v uint64, stored bool, cur *memcache.Item, err error) {
	v = uint64(time.Now().UnixMicro())
	val := strconv.FormatUint(v, 10)
	if d.servers == nil {
		err := d.add(context.Background(), &memcache.Item{Key: fk, Value: []byte(val), Expiration: d.fenceExp})
		if err != nil && !errors.Is(err, memcache.ErrNotStored) {
			return 0, false, nil, fmt.Errorf("memcachelock: fence: seed: %w", err)
		}
		return v, err == nil, nil, nil
	}
	addr, err := d.servers.PickServer(fk)
	if err != nil {
		return 0, false, nil, fmt.Errorf("memcachelock: %w", err)
	}
	var keys []string
	if lk != "" {
		keys = []string{lk}
	}
	lines, items, err := d.pipe(addr, d.checkTTL(ttl), true, appendAdd(nil, fk, d.fenceExp, []byte(val)), 1, keys...)
	var refused *backend.NotAcquiredError
	switch {
	case errors.As(err, &refused):
		return 0, false, nil, fmt.Errorf("memcachelock: %w", err)
	case err != nil:
		return 0, false, nil, fmt.Errorf("memcachelock: fence: seed: %w", err)
	case lines[0] != "STORED" && lines[0] != "NOT_STORED":
		return 0, false, nil, fmt.Errorf("memcachelock: fence: seed: unexpected reply %q", lines[0])
	}
	return v, lines[0] == "STORED", items[lk], nil
}

// pipe sends cmd, n commands that reply with one line each, then a gets of
// keys (if any), in one write on a probe to addr, which memcached runs in
// order, and returns the n reply lines and the items (nil if missing). With
// check > 0 it first makes sure, on that connection, that the server has
// run for check: if not, it sends nothing and returns a
// *backend.NotAcquiredError. Its errors are onProbe's.
func (d *Driver) pipe(addr net.Addr, check time.Duration, must bool, cmd []byte, n int, keys ...string) (lines []string, items map[string]*memcache.Item, err error) {
	err = d.onProbe(context.Background(), addr, must, func(p *probe) (err error) {
		if err = p.ranFor(check); err == nil {
			lines, items, err = p.send(cmd, n, keys)
		}
		return err
	})
	return lines, items, err
}

// send is pipe on p, without the check: keys must be distinct.
func (p *probe) send(cmd []byte, n int, keys []string) (lines []string, items map[string]*memcache.Item, err error) {
	cmd, ends := appendGets(cmd, keys)
	if _, err := p.Write(cmd); err != nil {
		return nil, nil, err
	}
	for range n {
		line, err := p.line()
		if err != nil {
			return nil, nil, err
		}
		lines = append(lines, line)
	}
	items = make(map[string]*memcache.Item, len(keys))
	for _, k := range keys {
		items[k] = nil // asked for: see readItems
	}
	return lines, items, p.readItems(ends, items)
}

// onProbe runs f, which writes its requests and reads their replies, on a
// probe to addr, within the client's timeout and ctx. Its errors are the
// connection's, a refusal f returns (a *backend.NotAcquiredError, which
// leaves the connection usable), or errBusy when none is idle and the cap
// is reached, unless must. An idle connection the server closed (a restart)
// is replaced, and f runs again on the new one.
func (d *Driver) onProbe(ctx context.Context, addr net.Addr, must bool, f func(*probe) error) error {
	for fresh := false; ; fresh = true {
		p, reused, err := d.probe(ctx, addr, fresh, must)
		if err != nil {
			return err
		}
		stop := p.arm(ctx, d.timeout())
		err = f(p)
		var refused *backend.NotAcquiredError
		if stop() && (err == nil || errors.As(err, &refused)) {
			d.putProbe(addr, p)
			return err
		}
		d.dropProbe(addr, p)
		if err == nil {
			return fmt.Errorf("memcachelock: %w", context.Cause(ctx)) // its deadline was cut short
		}
		if !reused || !staleConn(err) {
			return err
		}
	}
}

// arm sets p's deadline for one round trip: timeout from now, or ctx's
// deadline if sooner; and makes ctx's end cut the round trip short. stop
// reports false if it did (p must not be reused then).
func (p *probe) arm(ctx context.Context, timeout time.Duration) (stop func() bool) {
	dl := time.Now().Add(timeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	p.SetDeadline(dl)
	if ctx.Done() == nil {
		return func() bool { return true }
	}
	return context.AfterFunc(ctx, func() { p.SetDeadline(time.Unix(1, 0)) })
}

// ranFor returns nil if p's server has run for check (0: no check), else a
// *backend.NotAcquiredError; it reads the uptime once per connection.
func (p *probe) ranFor(check time.Duration) error {
	if check <= 0 {
		return nil
	}
	if p.started.IsZero() {
		up, err := p.stat("uptime")
		if err != nil {
			return err
		}
		p.started = time.Now().Add(uptimeSkew - time.Duration(up)*time.Second)
	}
	if up := time.Since(p.started); up < check {
		return &backend.NotAcquiredError{Reason: fmt.Sprintf(
			"the server started less than a TTL ago and may have forgotten a holder; it grants this name in %v", (check - up).Round(time.Millisecond))}
	}
	return nil
}

// readItems reads the replies of ends gets commands into items, whose
// keys are those asked for: a reply for another is out of step.
func (p *probe) readItems(ends int, items map[string]*memcache.Item) error {
	for ends > 0 {
		line, err := p.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if string(line) == "END\r\n" {
			ends--
			continue
		}
		it, err := readValue(p.r, line)
		if err != nil {
			return err
		}
		if _, ok := items[it.Key]; !ok {
			return fmt.Errorf("gets reply for a key not asked for: %q", it.Key)
		}
		items[it.Key] = it
	}
	return nil
}

// probe returns an idle connection to addr, or (fresh, or none idle) a new
// one, dialled within ctx: errBusy if the cap is reached, unless must.
func (d *Driver) probe(ctx context.Context, addr net.Addr, fresh, must bool) (p *probe, reused bool, err error) {
	ps := &d.probes
	k := addr.String()
	ps.mu.Lock()
	if q := ps.idle[k]; !fresh && len(q) > 0 {
		p = q[len(q)-1]
		ps.idle[k] = q[:len(q)-1]
		ps.mu.Unlock()
		return p, true, nil
	}
	if !must && ps.open[k] >= d.maxIdle() {
		ps.mu.Unlock()
		return nil, false, errBusy
	}
	if ps.open == nil {
		ps.open = map[string]int{}
	}
	ps.open[k]++
	ps.mu.Unlock()
	ps.dials.Add(1)
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	dial := d.mc.DialContext
	if dial == nil {
		dial = new(net.Dialer).DialContext
	}
	c, err := dial(ctx, addr.Network(), addr.String())
	if err != nil {
		d.dropProbe(addr, nil)
		return nil, false, err
	}
	return &probe{Conn: c, r: bufio.NewReader(c)}, false, nil
}

// dropProbe closes p (if not nil), a connection to addr that probe counted.
func (d *Driver) dropProbe(addr net.Addr, p *probe) {
	if p != nil {
		p.Close()
	}
	ps := &d.probes
	ps.mu.Lock()
	ps.open[addr.String()]--
	ps.mu.Unlock()
}

// putProbe keeps p for the next check, up to the client's idle limit.
func (d *Driver) putProbe(addr net.Addr, p *probe) {
	ps := &d.probes
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed || len(ps.idle[addr.String()]) >= d.maxIdle() {
		p.Close()
		ps.open[addr.String()]--
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
			p.Close()
		}
	}
	ps.idle = nil
}

// stat reads the server's statistic name, a count.
func (p *probe) stat(name string) (int64, error) {
	st, err := p.stats("stats\r\n")
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(st[name], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("the server's %s: unexpected %q", name, st[name])
	}
	return n, nil
}

// line reads the next reply line; the usual replies cost no allocation.
func (p *probe) line() (string, error) {
	b, err := p.r.ReadSlice('\n')
	if err != nil {
		return "", err
	}
	b = bytes.TrimRight(b, "\r\n")
	for _, r := range replies {
		if string(b) == r {
			return r, nil
		}
	}
	return string(b), nil
}

var replies = [...]string{"STORED", "NOT_STORED", "EXISTS", "NOT_FOUND", "END"}
