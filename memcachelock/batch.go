package memcachelock

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockerhq/locker/backend"
)

// RefreshMany refreshes many locks in O(servers) round trips
// (backend.BatchRefresher): per server, pipelined gets for all its locks,
// then pipelined cas for those still held by their token, on probes bounded
// by ctx. A cas that finds the item changed takes Refresh's path. A driver
// made by New, and permits, readers and writers, refresh one by one.
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
			errs[i] = d.refresh(ctx, l, exp)
		default:
			exps[i] = exp
			valid = append(valid, i)
		}
	}

	// Group the locks by server, in order of first appearance.
	var groups []*batchGroup
	byAddr := map[string]*batchGroup{}
	for _, i := range valid {
		lk := lockKey(locks[i].Key)
		addr, err := d.servers.PickServer(lk)
		if err != nil {
			errs[i] = fmt.Errorf("memcachelock: %w", err)
			continue
		}
		name := addr.Network() + "!" + addr.String()
		g := byAddr[name]
		if g == nil {
			g = &batchGroup{addr: addr}
			byAddr[name] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.keys = append(g.keys, lk)
	}
	// Each group in as few round trips as the replies' size allows.
	for _, g := range groups {
		for start := 0; start < len(g.idx); {
			end, size := start, 0
			for end < len(g.idx) {
				size += replyEstimate(g.keys[end], locks[g.idx[end]])
				if end > start && size > maxTripResponse {
					break
				}
				end++
			}
			d.refreshPart(ctx, g.addr, g.idx[start:end], g.keys[start:end], locks, exps, errs)
			start = end
		}
	}
	return errs
}

// batchGroup is the locks of one RefreshMany that live on one server.
type batchGroup struct {
	addr net.Addr
	idx  []int    // indexes into the locks
	keys []string // their item keys
}

// maxTripResponse bounds the estimated size of one round trip's gets
// replies: its requests are all written before the replies are read, so
// these must fit in the socket buffers (over 128 KiB on Linux by default),
// or both sides would wait until the deadline. A 512-lock batch of typical
// keys without owners is about 70 KiB: one round trip.
const maxTripResponse = 96 << 10

// getsPerCommand bounds the keys in one gets command (its line stays
// within about 25 KiB); a round trip pipelines several.
const getsPerCommand = 100

// replyEstimate is the size of the gets reply for one lock: "VALUE key
// flags bytes cas\r\n", the value (token, fence, space, owner) and "\r\n".
func replyEstimate(key string, l backend.Claim) int {
	return len(key) + 40 + tokenLen + 22 + 1 + min(len(l.Owner), maxOwnerLen) + 2
}

// refreshPart refreshes the locks idx, whose items keys live on addr: one
// round trip of gets, one of cas; a cas that finds the item changed takes
// Refresh's path.
func (d *Driver) refreshPart(ctx context.Context, addr net.Addr, idx []int, keys []string, locks []backend.Claim, exps []int32, errs []error) {
	fail := func(is []int, err error) {
		for _, i := range is {
			errs[i] = err
		}
	}
	if err := live(ctx, "refresh"); err != nil {
		fail(idx, err)
		return
	}
	var items map[string]*memcache.Item
	err := d.onProbe(ctx, addr, true, func(p *probe) (err error) {
		d.batch.trips.Add(1)
		_, items, err = p.send(nil, 0, slices.Compact(slices.Sorted(slices.Values(keys))))
		return err
	})
	if err != nil {
		fail(idx, fmt.Errorf("memcachelock: gets: %w", withCause(ctx, err)))
		return
	}

	// The cas commands, for the locks still held by their token.
	var held []int // indexes into locks
	var cmd []byte
	for p, i := range idx {
		switch it := items[keys[p]]; {
		case it == nil:
			errs[i] = fmt.Errorf("memcachelock: %w: no lock (expired, evicted, released or the server restarted)", backend.ErrNotHeld)
		case !heldBy(it.Value, locks[i].Token):
			errs[i] = fmt.Errorf("memcachelock: %w: another token holds it", backend.ErrNotHeld)
		default:
			settle(it.Value)
			cmd = appendCas(cmd, keys[p], it.Flags, exps[i], it.Value, it.CasID)
			held = append(held, i)
		}
	}
	if len(held) == 0 {
		return
	}
	if err := live(ctx, "refresh"); err != nil {
		fail(held, err)
		return
	}
	var replies []string
	err = d.onProbe(ctx, addr, true, func(p *probe) error {
		d.batch.trips.Add(1)
		replies = replies[:0]
		if _, err := p.Write(cmd); err != nil {
			return err
		}
		for range held {
			line, err := p.line()
			if err != nil {
				return err
			}
			switch {
			case line == "STORED", line == "EXISTS", line == "NOT_FOUND", line == "NOT_STORED":
			case strings.HasPrefix(line, "SERVER_ERROR "):
				// The server read the command and its data: the next
				// reply is the next command's.
			default:
				// Out of step with the commands: this reply and the rest
				// are unknown.
				return fmt.Errorf("unexpected reply %q", line)
			}
			replies = append(replies, line)
		}
		return nil
	})
	for n, i := range held {
		switch {
		case n >= len(replies):
			errs[i] = fmt.Errorf("memcachelock: cas: %w", withCause(ctx, err))
		case replies[n] == "EXISTS": // changed since the gets
			errs[i] = d.refresh(ctx, locks[i], exps[i])
		case replies[n] == "NOT_FOUND", replies[n] == "NOT_STORED":
			errs[i] = fmt.Errorf("memcachelock: %w: no lock (it expired or was evicted just now)", backend.ErrNotHeld)
		case replies[n] != "STORED":
			errs[i] = fmt.Errorf("memcachelock: cas: %s", replies[n]) // SERVER_ERROR
		}
	}
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

// appendAdd appends to b memcached's add command for an item.
func appendAdd(b []byte, key string, exp int32, value []byte) []byte {
	return fmt.Appendf(b, "add %s 0 %d %d\r\n%s\r\n", key, exp, len(value), value)
}

// appendGets appends to b gets commands for keys, at most getsPerCommand
// to a command, and returns how many.
func appendGets(b []byte, keys []string) ([]byte, int) {
	for chunk := range slices.Chunk(keys, getsPerCommand) {
		b = append(b, "gets"...)
		for _, k := range chunk {
			b = append(append(b, ' '), k...)
		}
		b = append(b, "\r\n"...)
	}
	return b, (len(keys) + getsPerCommand - 1) / getsPerCommand
}

// readValue reads an item of a gets reply from r: line, "VALUE <key>
// <flags> <bytes> <cas unique>\r\n", read already, then its value.
func readValue(r *bufio.Reader, line []byte) (*memcache.Item, error) {
	rest, ok := bytes.CutPrefix(line, []byte("VALUE "))
	rest, crlf := bytes.CutSuffix(rest, []byte("\r\n"))
	ok = ok && crlf
	var f [4][]byte // key, flags, bytes, cas: split without allocating
	for i := range f {
		var more bool
		f[i], rest, more = bytes.Cut(rest, []byte(" "))
		ok = ok && more == (i < 3) && len(f[i]) > 0
	}
	flags, err1 := strconv.ParseUint(string(f[1]), 10, 32)
	n, err2 := strconv.ParseUint(string(f[2]), 10, 31)
	cas, err3 := strconv.ParseUint(string(f[3]), 10, 64)
	if !ok || err1 != nil || err2 != nil || err3 != nil {
		return nil, fmt.Errorf("unexpected line in a gets reply: %q", bytes.TrimSpace(line))
	}
	// The key before the read reuses line's buffer.
	it := &memcache.Item{Key: string(f[0]), Flags: uint32(flags), CasID: cas, Value: make([]byte, n+2)}
	if _, err := io.ReadFull(r, it.Value); err != nil {
		return nil, err
	}
	if !bytes.HasSuffix(it.Value, []byte("\r\n")) {
		return nil, errors.New("corrupt gets reply: a value without its CRLF")
	}
	it.Value = it.Value[:n]
	return it, nil
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

// batchStats counts RefreshMany's calls and round trips, for tests and benchmarks.
type batchStats struct {
	calls atomic.Int64 // RefreshMany calls
	locks atomic.Int64 // locks passed to them
	trips atomic.Int64 // round trips (gets or cas) sent by RefreshMany
}
