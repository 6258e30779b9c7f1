//go:build unix && !linux

package main

// COMMAND runs in a background process group on these systems: fine for
// the non-interactive commands lockctl is for.
func foregroundTTY() (int, bool) { return 0, false }

func restoreTTY(int) {}
