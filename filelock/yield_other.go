//go:build !linux

package filelock

import "runtime"

// yield lets other goroutines run.
func yield() { runtime.Gosched() }
