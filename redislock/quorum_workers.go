package redislock

import "time"

// A Quorum's requests to its servers run on goroutines that stay for a
// while after their request (up to workerIdle), so that the next request
// finds one whose stack has grown to what a go-redis call needs: a new
// goroutine per request grows (copies) its stack on every call, a
// noticeable share of an uncontended acquisition's CPU time. A request
// that finds no idle worker starts one, so a slow server never holds up
// another request.

const workerIdle = time.Second

// run runs f on an idle worker, or on a new one.
func (q *Quorum) run(f func()) {
	select {
	case q.work <- f:
	default:
		go q.worker(f)
	}
}

// worker runs f, then the jobs that run hands it, until it has been idle
// for workerIdle or Close begins.
func (q *Quorum) worker(f func()) {
	f()
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		select {
		case f := <-q.work:
			f()
			t.Reset(workerIdle)
		case <-t.C:
			return
		case <-q.closing:
			return
		}
	}
}
