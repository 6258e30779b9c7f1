package filelock

import (
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// clock measures expiry: CLOCK_BOOTTIME, valid within the boot that boot
// names. It does not jump with the wall clock, and counts suspended time.
type clock struct{ boot [16]byte }

func (clock) now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic("filelock: clock_gettime(CLOCK_BOOTTIME): " + err.Error())
	}
	return ts.Nano()
}

// systemClock reads the boot ID once.
var systemClock = sync.OnceValues(func() (clock, error) {
	const path = "/proc/sys/kernel/random/boot_id"
	b, err := os.ReadFile(path)
	if err != nil {
		return clock{}, fmt.Errorf("reading the boot ID: %w (filelock needs /proc on Linux)", err)
	}
	raw, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	if err != nil || len(raw) != 16 {
		return clock{}, fmt.Errorf("%s: unexpected content %q", path, b)
	}
	return clock{boot: [16]byte(raw)}, nil
})
