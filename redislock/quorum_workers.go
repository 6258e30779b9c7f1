package redislock

import "time"

// A Quorum's requests run on goroutines that stay idle up to workerIdle
// after their request, so that the next finds a stack grown to what a
// go-redis call needs (growing one per request is a noticeable share of
// an acquisition's CPU time). A request that finds no idle worker starts
// one, so a slow server never holds up another request.

const workerIdle = time.Second

// run runs f on an idle worker, or on a new one.
func (q *Quorum) run(f func()) {
	select {
	case q.work <- f:
	default:
		go q.worker(f)
	}
}

// worker runs f, then others, until idle for workerIdle or Close begins.
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
