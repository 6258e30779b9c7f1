//go:build !unix

package bench

import "time"

// cpuTime is not measured here: CPU per acquisition reads 0.
func cpuTime() time.Duration { return 0 }
