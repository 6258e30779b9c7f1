package memcachelock

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// RefreshMany refreshes many locks in O(servers) round trips
// (backend.BatchRefresher): per server, pipelined gets for all its locks,
// then pipelined cas for those still held by their token, on the driver's
// own connections, bounded by ctx. A cas that finds the item changed
// (EXISTS) takes Refresh's path. A driver made by New, and permits,
// readers and writers, refresh one by one. See docs/backends/memcachelock.md.
func (d *Driver) RefreshMany(ctx context.Context, locks []backend.Claim) []error {
	errs := make([]error, len(locks))
	if len(locks) == 0 {
		return errs
	}
	d.batch.calls.Add(1)
	d.batch.locks.Add(int64(len(locks)))
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = fmt.Errorf("memcachelock: %w", err)
		}
		return errs
	}
	defer done()

	now := time.Now()
	exps := make([]int32, len(locks))
	valid := make([]int, 0, len(locks))
	for i, l := range locks {
		exp, _, err := checkClaim(l, now)
		switch {
		case err != nil:
			errs[i] = err
		case l.Mode != backend.Exclusive || d.servers == nil:
			// Permits, readers and writers, and a driver made by New
			// without the server list: one by one.
			errs[i] = d.refresh(ctx, l, exp)
		default:
			exps[i] = exp
			valid = append(valid, i)
		}
	}

	// Group the locks by server, in order of first appearance.
	var order []string
	groups := map[string]*batchGroup{}
	for _, i := range valid {
		lk := lockKey(locks[i].Key)
		addr, err := d.servers.PickServer(lk)
		if err != nil {
			errs[i] = fmt.Errorf("memcachelock: %w", err)
			continue
		}
		name := addr.Network() + "!" + addr.String()
		g := groups[name]
		if g == nil {
			g = &batchGroup{addr: addr}
			groups[name] = g
			order = append(order, name)
		}
		g.idx = append(g.idx, i)
		g.keys = append(g.keys, lk)
	}
	var again []int // EXISTS: changed since the gets
	for _, name := range order {
		again = d.refreshGroup(ctx, groups[name], locks, exps, errs, again)
	}
	for _, i := range again {
		errs[i] = d.refresh(ctx, locks[i], exps[i])
	}
	return errs
}

// batchGroup is the locks of one RefreshMany that live on one server.
type batchGroup struct {
	addr net.Addr
	idx  []int    // indexes into the locks
	keys []string // their item keys
}

// maxTripResponse bounds the estimated size of the gets replies that one
// round trip asks for: every request of a round trip is written before its
// replies are read, so the replies must fit in the socket buffers (the
// server's send buffer and ours to receive, over 128 KiB together on
// Linux by default) or the server would stop reading and both would wait
// until the deadline. A group whose replies may be larger is sent in
// several round trips. A 512-lock batch of typical keys (about 60 bytes)
// without owners is estimated at about 70 KiB: one round trip.
const maxTripResponse = 96 << 10

// getsPerCommand bounds the keys in one gets command (its line stays
// within about 25 KiB); a round trip pipelines several.
const getsPerCommand = 100

// replyEstimate is the size of the gets reply for one lock: "VALUE key
// flags bytes cas\r\n", the value (token, fence, space, owner) and "\r\n".
func replyEstimate(key string, l backend.Claim) int {
	return len(key) + 40 + tokenLen + 22 + 1 + min(len(l.Owner), maxOwnerLen) + 2
}

// refreshGroup refreshes g's locks, in as few round trips as the replies'
// size allows, and appends to again the locks whose cas found the item
// changed.
func (d *Driver) refreshGroup(ctx context.Context, g *batchGroup, locks []backend.Claim, exps []int32, errs []error, again []int) []int {
	for start := 0; start < len(g.idx); {
		end, size := start, 0
		for end < len(g.idx) {
			size += replyEstimate(g.keys[end], locks[g.idx[end]])
			if end > start && size > maxTripResponse {
				break
			}
			end++
		}
		again = d.refreshPart(ctx, g, g.idx[start:end], g.keys[start:end], locks, exps, errs, again)
		start = end
	}
	return again
}

// batchItem is what a gets reply says of one key.
type batchItem struct {
	flags uint32
	value []byte
	cas   uint64
}

func (d *Driver) refreshPart(ctx context.Context, g *batchGroup, idx []int, keys []string, locks []backend.Claim, exps []int32, errs []error, again []int) []int {
	failAll := func(err error) []int {
		for _, i := range idx {
			errs[i] = err
		}
		return again
	}
	if err := live(ctx, "refresh"); err != nil {
		return failAll(err)
	}
	c, pooled, err := d.probe(ctx, g.addr, false, true)
	if err != nil {
		return failAll(fmt.Errorf("memcachelock: dial: %w", withCause(ctx, err)))
	}
	items, err := d.gets(ctx, c, keys)
	if err != nil && pooled && staleConn(err) {
		// An idle connection the server closed (a restart): once more on a
		// new one. gets changes nothing, so repeating it is safe.
		d.dropProbe(g.addr, c)
		if err := live(ctx, "refresh"); err != nil {
			return failAll(err)
		}
		c, _, err = d.probe(ctx, g.addr, true, true)
		if err != nil {
			return failAll(fmt.Errorf("memcachelock: dial: %w", withCause(ctx, err)))
		}
		items, err = d.gets(ctx, c, keys)
	}
	if err != nil {
		d.dropProbe(g.addr, c)
		return failAll(fmt.Errorf("memcachelock: gets: %w", withCause(ctx, err)))
	}

	// The cas commands, for the locks still held by their token.
	var held []int // positions in idx
	c.w.Reset(c.Conn)
	for p, i := range idx {
		it, ok := items[keys[p]]
		switch {
		case !ok:
			errs[i] = fmt.Errorf("memcachelock: %w: no lock (expired, evicted, released or the server restarted)", backend.ErrNotHeld)
		case !heldBy(it.value, locks[i].Token):
			errs[i] = fmt.Errorf("memcachelock: %w: another token holds it", backend.ErrNotHeld)
		default:
			held = append(held, p)
		}
	}
	if len(held) == 0 {
		d.putProbe(g.addr, c)
		return again
	}
	failHeld := func(from int, err error) []int {
		for _, p := range held[from:] {
			errs[idx[p]] = err
		}
		return again
	}
	if err := live(ctx, "refresh"); err != nil {
		d.putProbe(g.addr, c)
		return failHeld(0, err)
	}
	stop := c.arm(ctx, d.timeout())
	var line []byte
	for _, p := range held {
		it := items[keys[p]]
		settle(it.value)
		line = appendCas(line[:0], keys[p], it.flags, exps[idx[p]], it.value, it.cas)
		c.w.Write(line) // a write error stays in w and Flush returns it
	}
	d.batch.trips.Add(1)
	err = c.w.Flush()
	n := 0 // replies read
replies:
	for ; err == nil && n < len(held); n++ {
		var reply []byte
		reply, err = c.r.ReadSlice('\n')
		if err != nil {
			break
		}
		i := idx[held[n]]
		switch string(reply) {
		case "STORED\r\n":
			errs[i] = nil
		case "EXISTS\r\n":
			again = append(again, i)
		case "NOT_FOUND\r\n", "NOT_STORED\r\n":
			errs[i] = fmt.Errorf("memcachelock: %w: no lock (it expired or was evicted just now)", backend.ErrNotHeld)
		default:
			if bytes.HasPrefix(reply, []byte("SERVER_ERROR ")) {
				// The server read the command and its data: the next
				// reply is the next command's.
				errs[i] = fmt.Errorf("memcachelock: cas: %s", bytes.TrimSpace(reply))
				continue
			}
			// Out of step with the commands: this reply and the rest
			// are unknown.
			err = fmt.Errorf("unexpected reply %q", bytes.TrimSpace(reply))
			break replies
		}
	}
	if !stop() || err != nil {
		d.dropProbe(g.addr, c)
	} else {
		d.putProbe(g.addr, c)
	}
	if err != nil {
		return failHeld(n, fmt.Errorf("memcachelock: cas: %w", withCause(ctx, err)))
	}
	return again
}

// gets asks for keys on c in one round trip (pipelined gets commands of at
// most getsPerCommand keys, each key once) and returns the items found.
func (d *Driver) gets(ctx context.Context, c *probe, keys []string) (map[string]batchItem, error) {
	stop := c.arm(ctx, d.timeout())
	items, err := c.gets(keys)
	d.batch.trips.Add(1)
	if !stop() && err == nil {
		err = fmt.Errorf("memcachelock: %w", context.Cause(ctx)) // its deadline was cut short
	}
	return items, err
}

func (c *probe) gets(keys []string) (map[string]batchItem, error) {
	c.w.Reset(c.Conn)
	seen := make(map[string]struct{}, len(keys))
	cmds, inCmd := 0, 0
	for _, k := range keys {
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		if inCmd == 0 {
			c.w.WriteString("gets")
			cmds++
		}
		c.w.WriteByte(' ')
		c.w.WriteString(k)
		if inCmd++; inCmd == getsPerCommand {
			c.w.WriteString("\r\n")
			inCmd = 0
		}
	}
	if inCmd > 0 {
		c.w.WriteString("\r\n")
	}
	if err := c.w.Flush(); err != nil {
		return nil, err
	}
	items := make(map[string]batchItem, len(keys))
	for cmds > 0 {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		if string(line) == "END\r\n" {
			cmds--
			continue
		}
		key, it, err := readValue(c.r, line)
		if err != nil {
			return nil, err
		}
		if _, asked := seen[key]; !asked {
			return nil, fmt.Errorf("memcachelock: gets reply for a key not asked for: %q", key)
		}
		items[key] = it
	}
	return items, nil
}

// appendCas appends to b memcached's cas command for an item.
func appendCas(b []byte, key string, flags uint32, exp int32, value []byte, cas uint64) []byte {
	b = append(append(b, "cas "...), key...)
	b = strconv.AppendUint(append(b, ' '), uint64(flags), 10)
	b = strconv.AppendInt(append(b, ' '), int64(exp), 10)
	b = strconv.AppendInt(append(b, ' '), int64(len(value)), 10)
	b = strconv.AppendUint(append(b, ' '), cas, 10)
	return append(append(append(b, "\r\n"...), value...), "\r\n"...)
}

// readValue reads an item of a gets reply from r: line, "VALUE <key>
// <flags> <bytes> <cas unique>\r\n", read already, then its value.
func readValue(r *bufio.Reader, line []byte) (key string, it batchItem, err error) {
	bad := func() error { return fmt.Errorf("unexpected line in a gets reply: %q", bytes.TrimSpace(line)) }
	rest, ok := bytes.CutPrefix(line, []byte("VALUE "))
	if !ok {
		return "", it, bad()
	}
	rest, ok = bytes.CutSuffix(rest, []byte("\r\n"))
	if !ok {
		return "", it, bad()
	}
	var f [4][]byte // key, flags, bytes, cas: split without allocating
	for i := range f {
		var ok bool
		if f[i], rest, ok = bytes.Cut(rest, []byte(" ")); ok != (i < 3) || len(f[i]) == 0 {
			return "", it, bad()
		}
	}
	flags, err1 := strconv.ParseUint(string(f[1]), 10, 32)
	n, err2 := strconv.ParseUint(string(f[2]), 10, 31)
	cas, err3 := strconv.ParseUint(string(f[3]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return "", it, bad()
	}
	key = string(f[0]) // before the read reuses line's buffer
	it = batchItem{flags: uint32(flags), cas: cas, value: make([]byte, n+2)}
	if _, err := io.ReadFull(r, it.value); err != nil {
		return "", it, err
	}
	if !bytes.HasSuffix(it.value, []byte("\r\n")) {
		return "", it, errors.New("corrupt gets reply: a value without its CRLF")
	}
	it.value = it.value[:n]
	return key, it, nil
}

// withCause adds ctx's cause to err when ctx ended: the deadline that cut
// a round trip short was then most likely ctx's.
func withCause(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	return err
}

func (d *Driver) timeout() time.Duration {
	if d.mc.Timeout > 0 {
		return d.mc.Timeout
	}
	return memcache.DefaultTimeout
}

func (d *Driver) maxIdle() int {
	if d.mc.MaxIdleConns > 0 {
		return d.mc.MaxIdleConns
	}
	return memcache.DefaultMaxIdleConns
}

// arm sets c's deadline for one round trip: the client's timeout from now,
// or ctx's deadline if sooner; and makes ctx's cancellation end the round
// trip at once. stop reports false if the cancellation did (c must not be
// reused then).
func (c *probe) arm(ctx context.Context, timeout time.Duration) (stop func() bool) {
	dl := time.Now().Add(timeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	c.SetDeadline(dl)
	return context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
}

// batchStats counts RefreshMany's calls and round trips for tests and
// benchmarks.
type batchStats struct {
	calls atomic.Int64 // RefreshMany calls
	locks atomic.Int64 // locks passed to them
	trips atomic.Int64 // round trips (gets or cas) sent by RefreshMany
}
