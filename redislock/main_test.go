package redislock

// The tests run on servers that start moments before them, with TTLs up to
// 720h, and most are not about restarts: they run with no restart delay.
// Those that are (restart_test.go, failure_test.go) turn it back on with
// withTTLRestartDelay, and the faults package runs with the default.
func init() { defaultRestartDelay = 0 }

// withTTLRestartDelay restores the default restart delay: the lock's TTL.
func withTTLRestartDelay() Option { return func(c *config) { c.restartDelay = -1 } }
