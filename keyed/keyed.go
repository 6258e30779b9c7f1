package keyed

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockerhq/locker"
)

// ErrClosed: the Executor was closed. Submit returns it for a task it
// refuses, and for a queued task that had not started when Close came.
var ErrClosed = errors.New("keyed: executor closed")

// ErrNilTask: Submit was given a nil function.
var ErrNilTask = errors.New("keyed: nil task")

// ErrInvalidOption: an Option's value is out of range, or New was given a
// nil Client. Submit returns it.
var ErrInvalidOption = errors.New("keyed: invalid option")

// Defaults of the options.
const (
	DefaultConcurrency = 16
	DefaultBatchTasks  = 64
	DefaultBatchHold   = 2 * time.Second
)

type config struct {
	concurrency int
	batchTasks  int
	batchHold   time.Duration
	lockOpts    []locker.LockOption
	err         error
}

// Option configures an Executor.
type Option func(*config)

// Concurrency sets how many keys an Executor works at once (default
// DefaultConcurrency). n must be at least 1.
func Concurrency(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.err = errors.Join(c.err, fmt.Errorf("%w: Concurrency(%d), want at least 1", ErrInvalidOption, n))
		}
		c.concurrency = n
	}
}

// Batch bounds one hold of a key's lock: at most tasks tasks, and no new
// task starts once hold has passed since the lock was taken (defaults
// DefaultBatchTasks and DefaultBatchHold). Then the lock is released and
// asked for again, so that other processes waiting for the key get their
// turn. Batch(1, ...) takes the lock for every task. tasks must be at least
// 1 and hold positive.
func Batch(tasks int, hold time.Duration) Option {
	return func(c *config) {
		if tasks < 1 || hold <= 0 {
			c.err = errors.Join(c.err, fmt.Errorf("%w: Batch(%d, %v), want at least 1 task and a positive hold", ErrInvalidOption, tasks, hold))
		}
		c.batchTasks, c.batchHold = tasks, hold
	}
}

// TTL sets the TTL of the keys' locks (default: the Client's). The
// Client's watchdog refreshes them while a batch runs.
func TTL(d time.Duration) Option {
	return func(c *config) {
		if err := locker.CheckTTL(d); err != nil {
			c.err = errors.Join(c.err, fmt.Errorf("keyed: %w", err))
		}
		c.lockOpts = append(c.lockOpts, locker.TTL(d))
	}
}

// Executor runs tasks serially per key. It is safe for concurrent use.
type Executor struct {
	c     *locker.Client
	cfg   config
	slots chan struct{}

	closing context.Context // ended by Close: lock waits stop
	close   context.CancelFunc
	runners sync.WaitGroup

	mu     sync.Mutex
	closed bool
	queues map[string]*queue // keys with a runner

	tasks, acquisitions atomic.Int64
}

// queue is one key's pending tasks on this Executor.
type queue struct {
	tasks []*task
	live  int                     // tasks not cancelled
	stop  context.CancelCauseFunc // ends the runner's lock wait; nil when not waiting
}

type task struct {
	ctx     context.Context
	fn      func(context.Context) error
	state   atomic.Int32 // pending, then started or cancelled
	done    chan error   // buffered: receives one result
	unwatch func() bool  // stops watching ctx
}

const (
	pending = iota
	started
	cancelled
)

// errIdle ends a lock wait that no live task needs any more.
var errIdle = errors.New("keyed: no task waits")

// New returns an Executor that takes its locks through c. c stays the
// caller's: close the Executor before it. An invalid option makes every
// Submit return an error wrapping ErrInvalidOption (or locker.ErrInvalidTTL),
// before any network call.
func New(c *locker.Client, opts ...Option) *Executor {
	cfg := config{concurrency: DefaultConcurrency, batchTasks: DefaultBatchTasks, batchHold: DefaultBatchHold}
	for _, o := range opts {
		o(&cfg)
	}
	if c == nil {
		cfg.err = errors.Join(cfg.err, fmt.Errorf("%w: nil Client", ErrInvalidOption))
	}
	e := &Executor{c: c, cfg: cfg, queues: map[string]*queue{}}
	if cfg.err == nil {
		e.slots = make(chan struct{}, cfg.concurrency)
	}
	e.closing, e.close = context.WithCancel(context.Background())
	return e
}

// Go queues fn behind the tasks of key already queued on this Executor and
// returns at once, before any network call; the channel receives fn's
// result once it has run, or why it did not. Tasks of one key queued by Go
// run in the order the Go calls returned, so one goroutine that reads
// events in order (a stream, a list) keeps their order by calling Go for
// each without waiting. See Submit for what runs and what comes back.
func (e *Executor) Go(ctx context.Context, key string, fn func(context.Context) error) <-chan error {
	done := make(chan error, 1)
	if err := e.check(ctx, key, fn); err != nil {
		done <- err
		return done
	}
	t := &task{ctx: ctx, fn: fn, done: done}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		done <- ErrClosed
		return done
	}
	q := e.queues[key]
	if q == nil {
		q = &queue{}
		e.queues[key] = q
		e.runners.Add(1)
		go e.run(key, q)
	}
	q.tasks = append(q.tasks, t)
	q.live++
	// A task whose ctx ends before it starts leaves the queue at once.
	t.unwatch = context.AfterFunc(ctx, func() {
		if !t.state.CompareAndSwap(pending, cancelled) {
			return
		}
		e.mu.Lock()
		q.live--
		if q.live == 0 && q.stop != nil {
			q.stop(errIdle)
		}
		e.mu.Unlock()
		done <- context.Cause(ctx)
	})
	e.mu.Unlock()
	return done
}

// Submit is Go, waiting for the result. fn runs while this Executor holds
// the lock named key, with a context that is ctx's, also cancelled, with
// the loss as its cause, if the lock is lost; LockFromContext finds the
// Lock (for its fence). Submit returns fn's error, joined with an error
// wrapping locker.ErrLost if the lock was lost while fn ran, or with the
// release's error when fn ended a batch. When fn does not run, the error
// says why: ErrClosed, ctx's cause (fn not started when ctx ended), the
// lock's error (a store failing for longer than the Client retries), or,
// before any network call, locker.ErrInvalidName, ErrNilTask or
// ErrInvalidOption. A panic in fn is recovered and returned as an error:
// it happens on the key's runner, not on the caller's goroutine, and the
// lock is released. Once fn has started, Submit waits for it whatever ctx
// does: fn never outlives its Submit.
//
// Submit blocks, which suits a caller with a goroutine per request; a
// caller that dispatches a stream of tasks from one goroutine uses Go,
// which fixes the order when it returns.
func (e *Executor) Submit(ctx context.Context, key string, fn func(context.Context) error) error {
	return <-e.Go(ctx, key, fn)
}

// check refuses what Go cannot queue.
func (e *Executor) check(ctx context.Context, key string, fn func(context.Context) error) error {
	if e.cfg.err != nil {
		return e.cfg.err
	}
	if fn == nil {
		return ErrNilTask
	}
	if err := locker.CheckName(key); err != nil {
		return fmt.Errorf("keyed: key: %w", err)
	}
	return context.Cause(ctx)
}

// Close refuses new tasks with ErrClosed, ends the waits for locks, fails
// the queued tasks that have not started with ErrClosed, and waits for
// the running ones to finish and their locks to be released. It does not
// close the Client.
func (e *Executor) Close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.close()
	e.runners.Wait()
	return nil
}

// Stats counts what an Executor did.
type Stats struct {
	Tasks        int64 // tasks run (fn called)
	Acquisitions int64 // locks taken; Tasks/Acquisitions is the mean batch
}

// Stats returns the Executor's counts so far.
func (e *Executor) Stats() Stats {
	return Stats{Tasks: e.tasks.Load(), Acquisitions: e.acquisitions.Load()}
}

type lockKey struct{}

// LockFromContext returns the lock under which a task runs, from the
// context Submit gives it, or nil.
func LockFromContext(ctx context.Context) *locker.Lock {
	l, _ := ctx.Value(lockKey{}).(*locker.Lock)
	return l
}

// run is the runner of key: it takes the lock and runs batches until the
// queue is empty or the Executor closes.
func (e *Executor) run(key string, q *queue) {
	defer e.runners.Done()
	for {
		// Drop the cancelled tasks at the head; leave when none is left.
		e.mu.Lock()
		for len(q.tasks) > 0 && q.tasks[0].state.Load() == cancelled {
			q.tasks = q.tasks[1:]
		}
		if len(q.tasks) == 0 || e.closed {
			delete(e.queues, key)
			rest := q.tasks
			q.tasks = nil
			e.mu.Unlock()
			for _, t := range rest {
				t.fail(ErrClosed)
			}
			return
		}
		wait, stop := context.WithCancelCause(e.closing)
		q.stop = stop
		e.mu.Unlock()

		err := e.batch(wait, key, q)
		stop(nil)
		if err != nil {
			// The lock was not taken for a reason other than Close or an
			// idle queue: the head task gets the error, the rest try again.
			e.mu.Lock()
			var head *task
			if len(q.tasks) > 0 {
				head = q.tasks[0]
				q.tasks = q.tasks[1:]
			}
			e.mu.Unlock()
			if head != nil && head.state.CompareAndSwap(pending, started) {
				e.mu.Lock()
				q.live--
				e.mu.Unlock()
				head.unwatch()
				head.done <- err
			}
		}
	}
}

// batch takes a slot and the lock, and runs queued tasks under it. It
// returns an error only when the lock could not be taken while a task
// needed it and the Executor was open.
func (e *Executor) batch(wait context.Context, key string, q *queue) error {
	select {
	case e.slots <- struct{}{}:
	case <-wait.Done():
		return nil
	}
	defer func() { <-e.slots }()
	l, err := e.c.Acquire(wait, key, e.cfg.lockOpts...)
	if err != nil {
		if wait.Err() != nil {
			return nil // closed or idle: run decides
		}
		return err
	}
	e.acquisitions.Add(1)
	e.mu.Lock()
	q.stop = nil // from now on, the tasks' contexts alone end them
	e.mu.Unlock()

	// One watch of the loss for the whole batch.
	held, lose := context.WithCancelCause(context.Background())
	defer lose(nil)
	watched := make(chan struct{})
	go func() {
		select {
		case <-l.Lost():
			lose(l.Err())
		case <-watched:
		}
	}()
	defer close(watched)

	var last *task
	var lastErr error
	start := time.Now()
	for n := 0; n < e.cfg.batchTasks && time.Since(start) < e.cfg.batchHold && l.Err() == nil; {
		t := e.next(q)
		if t == nil {
			break
		}
		if last != nil {
			last.done <- lastErr
		}
		n++
		last, lastErr = t, e.runTask(t, l, held)
	}
	// Release before the batch's last task reports, as Do does, so that
	// its Submit returns with the lock free and hears of a failed release.
	rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout(l.TTL()))
	rerr := l.Release(rctx)
	cancel()
	if last != nil {
		if l.Err() == nil && rerr != nil {
			lastErr = errors.Join(lastErr, rerr)
		}
		last.done <- lastErr
	}
	return nil
}

// next pops the first task that is still pending, marked started, or
// returns nil when none is queued or the Executor is closing.
func (e *Executor) next(q *queue) *task {
	e.mu.Lock()
	defer e.mu.Unlock()
	for len(q.tasks) > 0 && !e.closed {
		t := q.tasks[0]
		q.tasks = q.tasks[1:]
		if t.state.CompareAndSwap(pending, started) {
			q.live--
			t.unwatch()
			return t
		}
	}
	return nil
}

// runTask runs t under l; held ends with the loss as its cause.
func (e *Executor) runTask(t *task, l *locker.Lock, held context.Context) (err error) {
	e.tasks.Add(1)
	ctx, cancel := context.WithCancelCause(context.WithValue(t.ctx, lockKey{}, l))
	defer cancel(nil)
	defer context.AfterFunc(held, func() { cancel(context.Cause(held)) })()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("keyed: task panicked: %v", p)
		}
		if lost := l.Err(); lost != nil && !errors.Is(err, lost) {
			err = errors.Join(err, lost)
		}
	}()
	return t.fn(ctx)
}

func (t *task) fail(err error) {
	if t.state.CompareAndSwap(pending, started) {
		t.unwatch()
		t.done <- err
	}
}

// releaseTimeout bounds a release: past the TTL the store frees the lock
// anyway.
func releaseTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl, time.Second), 10*time.Second)
}
