package memlock

import (
	"context"
	"time"

	"github.com/lockerhq/locker/backend"
)

var _ backend.Diagnoser = (*Driver)(nil)

// Diagnose implements backend.Diagnoser: an in-process store has nothing
// that could lose a lock, and says what it excludes.
func (d *Driver) Diagnose(context.Context, time.Duration) ([]backend.Finding, error) {
	return []backend.Finding{{Check: "mem.scope", Level: backend.Sound,
		What: "an in-process store: its locks exclude this process's goroutines only"}}, nil
}
