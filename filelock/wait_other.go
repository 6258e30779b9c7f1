//go:build !linux

package filelock

import (
	"runtime"
	"time"
)

// queuesWaiters says that the driver is no backend.Queuer here: the locker
// package polls, and withdraws a refused writer's record.
const queuesWaiters = false

// notifierPool keeps nothing here.
type notifierPool struct{}

func (*notifierPool) close() {}

// clock measures expiry on the wall clock, in Unix nanoseconds.
type clock struct{ boot [16]byte }

func (clock) now() int64 { return time.Now().UnixNano() }

func systemClock() (clock, error) { return clock{}, nil }

// yield lets other goroutines run.
func yield() { runtime.Gosched() }
