package memcachelock

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/lockerhq/locker/backend"
)

var (
	_ backend.Diagnoser  = (*Driver)(nil)
	_ backend.StoreClock = (*Driver)(nil)
)

// Diagnose implements backend.Diagnoser: on each server, whether it may
// evict (an evicted lock item is a lock lost silently) and whether it has,
// and what a restart costs. Only a driver made by Open knows its servers.
func (d *Driver) Diagnose(ctx context.Context, ttl time.Duration) ([]backend.Finding, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("memcachelock: diagnose: %w", err)
	}
	defer done()
	if d.servers == nil {
		return []backend.Finding{{Check: "memcache.servers", Level: backend.Warning, What: "a driver made by New does not know its servers",
			Why: "eviction cannot be checked", Fix: "run lockctl doctor with the memcache:// URL"}}, nil
	}
	var fs []backend.Finding
	err = d.servers.Each(func(addr net.Addr) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var settings, stats map[string]string
		err := d.onProbe(context.Background(), addr, true, func(p *probe) (err error) {
			if settings, err = p.stats("stats settings\r\n"); err == nil {
				stats, err = p.stats("stats\r\n")
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		fs = append(fs, judge(addr.String(), settings, stats, ttl)...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("memcachelock: diagnose: %w", err)
	}
	return fs, nil
}

// judge weighs one server's settings and stats.
func judge(addr string, settings, stats map[string]string, ttl time.Duration) []backend.Finding {
	fs := backend.Findings{Check: "memcache.", What: addr + ": "}
	const lost = "an evicted lock item is a lock lost without its holder knowing until its next refresh, and a second holder let in"
	switch evicted := stats["evictions"]; {
	case settings["evictions"] == "off":
		fs.Add("eviction", backend.Sound, "evictions off (-M): a full server refuses new locks instead of dropping held ones", "", "")
	case evicted != "" && evicted != "0":
		fs.Add("eviction", backend.Unsafe, fmt.Sprintf("evictions on, and %s items evicted so far (%s of %s bytes in use)", evicted, stats["bytes"], stats["limit_maxbytes"]),
			lost, "memcached -M (refuse rather than evict), or more memory (-m), or a server of its own for locks")
	default:
		fs.Add("eviction", backend.Warning, fmt.Sprintf("evictions on, none yet (%s of %s bytes in use)", stats["bytes"], stats["limit_maxbytes"]),
			"once the memory fills, "+lost, "memcached -M (refuse rather than evict), or a server of its own for locks")
	}
	delay := "one TTL"
	if ttl > 0 {
		delay = ttl.String()
	}
	fs.Add("restart", backend.Sound, fmt.Sprintf("up %ss; memcached keeps nothing across a restart, so a restarted server refuses the names it has no fence for, for %s (the delayed restart)", stats["uptime"], delay), "", "")
	return fs.List
}

// stats sends cmd (a stats command) and reads its STAT lines.
func (p *probe) stats(cmd string) (map[string]string, error) {
	if _, err := io.WriteString(p.Conn, cmd); err != nil {
		return nil, err
	}
	m := map[string]string{}
	for {
		line, err := p.line()
		if err != nil {
			return nil, err
		}
		if line == "END" {
			return m, nil
		}
		if k, v, ok := strings.Cut(strings.TrimPrefix(line, "STAT "), " "); ok {
			m[k] = v
		}
	}
}

// StoreTime implements backend.StoreClock: the first server's time, which
// memcached counts in whole seconds (the middle of that second).
func (d *Driver) StoreTime(ctx context.Context) (time.Time, error) {
	ctx, done, err := d.gate.Enter(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("memcachelock: %w", err)
	}
	defer done()
	if d.servers == nil {
		return time.Time{}, fmt.Errorf("memcachelock: a driver made by New does not know its servers: %w", backend.ErrUnsupported)
	}
	var t time.Time
	err = d.servers.Each(func(addr net.Addr) error {
		if !t.IsZero() {
			return nil
		}
		return d.onProbe(context.Background(), addr, true, func(p *probe) error {
			sec, err := p.stat("time")
			if err == nil {
				t = time.Unix(sec, int64(500*time.Millisecond))
			}
			return err
		})
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("memcachelock: %w", err)
	}
	return t, nil
}
