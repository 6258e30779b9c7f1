// Package faults is the fault-injection suite of issue #11: it drives
// locker.Clients on every backend through TCP fault proxies
// (internal/faultproxy) to private servers (internal/testenv) that it
// pauses, kills and restarts, records what every holder believes
// (internal/history), and fails when two holders of one name overlap
// without the first being told, when fences go back, when a lost signal
// comes later than the Client's own deadline, or when cancel and Close are
// not bounded on a dead connection.
//
// The package holds only tests. `go test ./internal/faults` runs a bounded
// set of cases (about 3 minutes on 2 cores); `go test ./internal/faults
// -run Soak -faults.soak=20s` runs the random fault schedule for 20 s per
// backend and prints, per backend, the faults injected, the acquisitions
// checked and the violations.
package faults
