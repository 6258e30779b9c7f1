//go:build !linux

package filelock

// fsType: only Linux's statfs is read.
func fsType(string) (string, bool) { return "", false }
