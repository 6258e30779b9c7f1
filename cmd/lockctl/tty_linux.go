package main

import (
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// foregroundTTY reports whether standard input is a terminal whose
// foreground process group is lockctl's, and its descriptor.
func foregroundTTY() (int, bool) {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	return 0, err == nil && pgrp == syscall.Getpgrp()
}

// restoreTTY gives the terminal back to lockctl's process group once
// COMMAND's group, which had it, has exited.
func restoreTTY(fd int) {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, syscall.Getpgrp())
}
