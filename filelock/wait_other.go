//go:build !linux

package filelock

// queuesWaiters says that the driver is no backend.Queuer here: the locker
// package polls, and withdraws a refused writer's record.
const queuesWaiters = false

// notifierPool keeps nothing here.
type notifierPool struct{}

func (*notifierPool) close() {}
