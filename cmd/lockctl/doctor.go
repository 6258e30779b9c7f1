//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

const doctorUsage = `usage: lockctl doctor [--ttl D] [--json] [--timeout D] [--backend URL]

Checks the deployment under the backend for what would break a lock's
guarantees: a store that may evict or forget locks, settings that undo
durability, replication that a failover can lose grants to, credentials
with more rights than locking needs, weak transport, the clock offset
between this host and the store. One line per finding: its level (ok,
warning, unsafe), what was found, why it matters, and the fix.

Exit status: 0 sound, 1 warnings, 2 unsafe, or an error before the checks
(bad flags, an unreachable store).

`

// clockWarn is the offset between this host's clock and the store's past
// which doctor warns: locks are judged on durations, each on one clock, so
// an offset breaks nothing by itself, but it says that a clock is not
// synchronized, and an unsynchronized clock may also run at the wrong rate.
const clockWarn = time.Second

func doctorCmd(args []string, global backendFlag, stdout, stderr io.Writer) int {
	o := newOpsFlags("doctor", global, true, false)
	var ttl time.Duration
	o.fs.duration(&ttl, "ttl", locker.DefaultTTL, "the lock TTL in use, for the checks that weigh settings against it")
	operands, code, ok := o.parse(args, stdout, stderr, doctorUsage)
	if !ok {
		return code
	}
	if len(operands) > 0 {
		errorf(stderr, "doctor", "takes no arguments")
		return exitUsage
	}
	rawURL, err := resolveURL(o.backend, stderr)
	if err == nil {
		rawURL, _, err = expandURL(rawURL)
	}
	if err != nil {
		errorf(stderr, "doctor", "%v", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	// The driver's warnings at open (weak transport) are findings too.
	warned := &collect{}
	// The TTL in use sizes a ZooKeeper session, as it does for run.
	dctx := backend.WithDefaultTTL(backend.WithLogger(ctx, slog.New(warned)), ttl)
	drv, _, err := locker.OpenDriver(dctx, rawURL)
	if err != nil {
		errorf(stderr, "doctor", "%v", err)
		return exitUsage
	}
	defer drv.Close()
	fs := warned.findings()
	if dg, ok := backend.As[backend.Diagnoser](drv); ok {
		f, err := dg.Diagnose(ctx, ttl)
		if err != nil {
			errorf(stderr, "doctor", "%v", err)
			return exitUsage
		}
		fs = append(fs, f...)
	} else {
		fs = append(fs, backend.Finding{Check: "doctor", Level: backend.Warning, What: "this backend has no checks of its deployment",
			Why: "nothing here says whether the store can lose a lock", Fix: "read its page in docs/backends"})
	}
	if sc, ok := backend.As[backend.StoreClock](drv); ok {
		fs = append(fs, clockFinding(ctx, sc))
	}
	slices.SortStableFunc(fs, func(a, b backend.Finding) int { return strings.Compare(a.Check+a.What, b.Check+b.What) })
	worst := backend.Sound
	for _, f := range fs {
		worst = max(worst, f.Level)
	}
	if o.json {
		writeJSON(stdout, struct {
			Store    string            `json:"store"`
			Level    string            `json:"level"`
			Findings []backend.Finding `json:"findings"`
		}{backend.RedactedString(rawURL), worst.String(), fs})
	} else {
		fmt.Fprintf(stdout, "%s: %s\n", backend.RedactedString(rawURL), worst)
		for _, f := range fs {
			line := fmt.Sprintf("%-7s %s: %s", f.Level, f.Check, f.What)
			if f.Why != "" {
				line += "; " + f.Why
			}
			if f.Fix != "" {
				line += ". Fix: " + f.Fix
			}
			fmt.Fprintln(stdout, line)
		}
	}
	return int(worst)
}

// clockFinding measures the offset of the store's clock from this host's,
// to within half the round trip.
func clockFinding(ctx context.Context, sc backend.StoreClock) backend.Finding {
	t0 := time.Now()
	st, err := sc.StoreTime(ctx)
	rtt := time.Since(t0)
	if err != nil {
		return backend.Finding{Check: "clock", Level: backend.Warning, What: "cannot read the store's clock: " + err.Error()}
	}
	off := st.Sub(t0.Add(rtt / 2))
	what := fmt.Sprintf("the store's clock is %v from this host's (±%v)", off.Round(time.Millisecond), (rtt / 2).Round(time.Millisecond))
	if off.Abs()-rtt/2 > clockWarn {
		return backend.Finding{Check: "clock", Level: backend.Warning, What: what,
			Why: "one of the clocks is not synchronized, and may run at the wrong rate too, which shortens a lock's real life",
			Fix: "synchronize both hosts with NTP (chrony, systemd-timesyncd)"}
	}
	return backend.Finding{Check: "clock", Level: backend.Sound, What: what}
}

// collect turns the Warn records of a driver's open into findings.
type collect struct {
	mu  sync.Mutex
	out []backend.Finding
}

func (c *collect) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (c *collect) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out = append(c.out, backend.Finding{Check: "transport", Level: backend.Warning, What: r.Message})
	return nil
}
func (c *collect) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *collect) WithGroup(string) slog.Handler      { return c }

func (c *collect) findings() []backend.Finding {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.out)
}
