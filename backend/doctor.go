package backend

import (
	"context"
	"time"
)

// A Diagnoser checks the deployment under a driver for what would break a
// lock's guarantees: a store that may evict or forget locks, settings
// that undo durability, credentials with more rights than locking needs.
// `lockctl doctor` runs it. It reports what it read and judged; it changes
// nothing. A check it cannot run (the credential may not read a setting)
// is a Finding too, at Warning, that says what to grant.
type Diagnoser interface {
	// Diagnose reports what it finds; ttl is the lock TTL in use, 0 when
	// unknown, for the checks that weigh settings against it.
	Diagnose(ctx context.Context, ttl time.Duration) ([]Finding, error)
}

// A StoreClock reads the store's clock, so that `lockctl doctor` can report
// the offset between this host's clock and the store's.
type StoreClock interface {
	StoreTime(ctx context.Context) (time.Time, error)
}

// Level is how much a Finding matters.
type Level int

const (
	Sound   Level = iota // checked, and fine
	Warning              // safe today, but fragile, or not checked
	Unsafe               // can let two holders in at once, or lose a lock silently
)

func (l Level) String() string {
	switch l {
	case Sound:
		return "ok"
	case Warning:
		return "warning"
	case Unsafe:
		return "unsafe"
	}
	return "unknown"
}

// Finding is one check's result: What it found, Why that matters and how
// to Fix it (empty when Sound). Check names the check, short and stable
// (for example "redis.maxmemory-policy"), for scripts that read
// `lockctl doctor --json`.
type Finding struct {
	Check string `json:"check"`
	Level Level  `json:"level"`
	What  string `json:"what"`
	Why   string `json:"why,omitempty"`
	Fix   string `json:"fix,omitempty"`
}

// Findings collects a diagnosis. Add prefixes each Finding's Check with
// Check (the driver's, "redis.") and its What with What (the server's
// address and ": ", or "" when the check is of the whole deployment).
type Findings struct {
	Check, What string
	List        []Finding
}

// Add appends a Finding; why and fix are "" when l is Sound.
func (fs *Findings) Add(check string, l Level, what, why, fix string) {
	fs.List = append(fs.List, Finding{Check: fs.Check + check, Level: l, What: fs.What + what, Why: why, Fix: fix})
}
