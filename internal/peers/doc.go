// Package peers benchmarks this project's drivers against the libraries
// people use today (bsm/redislock, redsync, etcd's concurrency.Mutex,
// go-zookeeper's zk.Lock) on the same servers, in the same run, through the
// contended harness of internal/bench. It is a module of its own so that
// the peers never become dependencies of the locker module.
//
//	cd internal/peers && go test -run '^$' -bench . -benchtime 2000x
package peers
