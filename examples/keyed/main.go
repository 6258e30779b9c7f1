//go:build unix

// Command keyed runs grouped tasks one group at a time across processes,
// and shows a crashed process's task resumed without overlap.
//
// A producer pushes tasks, grouped by key (tenant + entity), onto a Redis
// list in order. Two worker processes take them with a reliable pop (BLMOVE
// into a processing list of their own) and hand them to a keyed.Executor,
// which runs the tasks of one key one at a time across both processes. Each
// worker keeps a liveness key alive; when one's expires, the other moves the
// dead worker's processing list into its own and runs those tasks again.
// The lock of a key keeps a resumed task from running while the dead
// worker's lock still stands, and each run is recorded through a script that
// refuses a fence lower than the key's last: a writer that lost its lock
// cannot record over a newer one.
//
// Run without -worker, the command is the demo: it pushes the tasks, starts
// two workers (itself, with -worker), SIGKILLs the first in the middle of a
// task, waits for the second to finish everything and checks the history.
//
//	go run ./examples/keyed                               # locks on Redis, fair=true
//	LOCKER_URL=etcd://127.0.0.1:2379 go run ./examples/keyed
//
// It needs a Unix system: the demo stops and kills a worker with signals.
// The task queue is always the Redis at LOCKER_REDIS_ADDR (127.0.0.1:6379
// by default); LOCKER_URL chooses the lock store (default: that Redis with
// fair=true, which grants a key's lock in the order the processes asked).
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	_ "github.com/lockerhq/locker/etcdlock"
	_ "github.com/lockerhq/locker/filelock"
	"github.com/lockerhq/locker/keyed"
	_ "github.com/lockerhq/locker/memcachelock"
	_ "github.com/lockerhq/locker/pglock"
	_ "github.com/lockerhq/locker/redislock"
	_ "github.com/lockerhq/locker/zklock"
)

// config is the scenario's shape; the demo passes it on to the workers.
type config struct {
	run      string        // the run's id: its Redis keys and lock namespace
	groups   int           // keys
	tasks    int           // tasks per key
	work     time.Duration // one task's run time
	prefetch int           // tasks a worker holds popped but unfinished
	ttl      time.Duration // the keys' locks' TTL
	live     time.Duration // a worker's liveness TTL
	timeout  time.Duration // bound of the whole run
}

// errFlag: a flag is out of range.
var errFlag = errors.New("invalid flag")

// validate refuses a shape the run cannot have, before any network call.
func (c config) validate() error {
	var errs []error
	bad := func(ok bool, format string, a ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("%w: "+format, append([]any{errFlag}, a...)...))
		}
	}
	bad(c.groups >= 1 && c.tasks >= 1, "-groups %d -tasks %d, want at least 1 each", c.groups, c.tasks)
	bad(c.work > 0, "-work %v, want a positive duration", c.work)
	bad(c.prefetch >= 1, "-prefetch %d, want at least 1", c.prefetch)
	bad(c.live >= 10*time.Millisecond, "-live %v, want at least 10ms", c.live)
	bad(c.timeout > 0, "-timeout %v, want a positive duration", c.timeout)
	if err := locker.CheckTTL(c.ttl); err != nil {
		errs = append(errs, fmt.Errorf("-ttl: %w", err))
	}
	return errors.Join(errs...)
}

func (c config) args() []string {
	return []string{"-run", c.run, "-groups", fmt.Sprint(c.groups), "-tasks", fmt.Sprint(c.tasks),
		"-work", c.work.String(), "-prefetch", fmt.Sprint(c.prefetch), "-ttl", c.ttl.String(),
		"-live", c.live.String(), "-timeout", c.timeout.String()}
}

func main() {
	var cfg config
	worker := flag.String("worker", "", "run as the worker NAME (the demo starts two)")
	flag.StringVar(&cfg.run, "run", "", "the run's id (a worker's is given by the demo)")
	flag.IntVar(&cfg.groups, "groups", 6, "keys (tenant + entity)")
	flag.IntVar(&cfg.tasks, "tasks", 10, "tasks per key")
	flag.DurationVar(&cfg.work, "work", 150*time.Millisecond, "how long one task runs")
	flag.IntVar(&cfg.prefetch, "prefetch", 8, "tasks a worker takes ahead of finishing them")
	flag.DurationVar(&cfg.ttl, "ttl", 3*time.Second, "TTL of the keys' locks")
	flag.DurationVar(&cfg.live, "live", time.Second, "a worker is dead once its liveness key is this old")
	flag.DurationVar(&cfg.timeout, "timeout", 2*time.Minute, "bound of the whole run")
	flag.Parse()
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *worker != "" && cfg.run == "" {
		fmt.Fprintln(os.Stderr, "a worker needs the -run of the demo that started it")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if *worker != "" {
		if err := work(ctx, cfg, *worker, os.Stdout); err != nil {
			log.Fatalf("%s: %v", *worker, err)
		}
		return
	}
	bin, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	res, err := demo(ctx, bin, cfg, os.Stdout)
	if err != nil {
		log.Fatal(err)
	}
	if rep := check(res); len(rep.problems) > 0 {
		os.Exit(1)
	}
}

// redisAddr is the task queue's Redis.
func redisAddr() string {
	if a := os.Getenv("LOCKER_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// lockURL is the lock store.
func lockURL() string {
	if u := os.Getenv("LOCKER_URL"); u != "" {
		return u
	}
	return "redis://" + redisAddr() + "/0?fair=true"
}

// keys names the run's Redis keys; the hash tag keeps them on one slot.
type keys string

func keysOf(run string) keys                 { return keys("keyed-example:{" + run + "}:") }
func (k keys) queue() string                 { return string(k) + "queue" }
func (k keys) total() string                 { return string(k) + "total" }
func (k keys) workers() string               { return string(k) + "workers" }
func (k keys) alive(w string) string         { return string(k) + "alive:" + w }
func (k keys) processing(w string) string    { return string(k) + "processing:" + w }
func (k keys) running(w string) string       { return string(k) + "running:" + w }
func (k keys) history() string               { return string(k) + "history" }
func (k keys) done() string                  { return string(k) + "done" }
func (k keys) fence(key string) string       { return string(k) + "fence:" + key }
func namespace(run string) locker.Option     { return locker.WithNamespace("keyed-example-" + run) }
func groupKey(g int) string                  { return fmt.Sprintf("tenant-%d/entity-%d", g/2+1, g%2+1) }
func clientName(run, proc string) string     { return "keyed-example-" + run + "-" + proc }
func stamp() int64                           { return time.Now().UnixNano() }
func since(t0 int64, t int64) time.Duration  { return time.Duration(t - t0).Round(time.Millisecond) }
func jsonOf(v any) string                    { b, _ := json.Marshal(v); return string(b) }
func parse[T any](s string) (v T, err error) { err = json.Unmarshal([]byte(s), &v); return v, err }

func newRedis(run, proc string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: redisAddr(), ClientName: clientName(run, proc)})
}

// closed waits until the server has no connection left named name.
func closed(ctx context.Context, rdb *redis.Client, name string) error {
	by := time.Now().Add(10 * time.Second)
	for {
		list, err := rdb.ClientList(ctx).Result()
		if err != nil {
			return err
		}
		if !strings.Contains(list, " name="+name+" ") {
			return nil
		}
		if time.Now().After(by) {
			return fmt.Errorf("the server still has connections of %s after 10s", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// item is a task on the queue.
type item struct {
	ID  int    `json:"id"`
	Key string `json:"key"`
	Seq int    `json:"seq"` // place among its key's tasks, from 1
}

// run is one run of a task, as recorded.
type run struct {
	item
	Proc      string `json:"proc"`
	Take      int    `json:"take"`      // the worker's count of tasks taken, at this one
	Reclaimed bool   `json:"reclaimed"` // taken from a dead worker's processing list
	Fence     uint64 `json:"fence"`
	Start     int64  `json:"start"` // Unix ns
	End       int64  `json:"end"`   // Unix ns; 0: did not finish
}

// record stores a finished run, unless a run of its key with a higher
// fence was recorded already (fences are compared as decimal strings, so
// that any uint64 compares exactly). The run leaves the worker's running
// hash and processing list in the same step: a crash either records it or
// leaves it to be run again.
var record = redis.NewScript(`
local function less(a, b)
	if #a ~= #b then return #a < #b end
	return a < b
end
local last = redis.call('GET', KEYS[1])
if last and less(ARGV[1], last) then
	return redis.error_reply('stale fence ' .. ARGV[1] .. ', after ' .. last)
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('HDEL', KEYS[4], ARGV[3])
redis.call('LREM', KEYS[5], 1, ARGV[4])
return 1
`)

// work is one worker process: it takes tasks until every task of the run
// is done.
func work(ctx context.Context, cfg config, name string, out io.Writer) error {
	k := keysOf(cfg.run)
	rdb := newRedis(cfg.run, name)
	defer rdb.Close()
	c, err := locker.Open(ctx, lockURL(), namespace(cfg.run), locker.WithDefaultTTL(cfg.ttl))
	if err != nil {
		return err
	}
	defer c.Close()
	ex := keyed.New(c, keyed.TTL(cfg.ttl))
	defer ex.Close()

	beat := func(ctx context.Context) error {
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.SAdd(ctx, k.workers(), name)
			p.Set(ctx, k.alive(name), stamp(), cfg.live)
			return nil
		})
		return err
	}
	if err := beat(ctx); err != nil {
		return err
	}
	beating, stopBeat := context.WithCancel(ctx)
	defer stopBeat()
	go func() {
		t := time.NewTicker(cfg.live / 4)
		defer t.Stop()
		for {
			select {
			case <-beating.Done():
				return
			case <-t.C:
				if err := beat(beating); err != nil && beating.Err() == nil {
					log.Printf("%s: heartbeat: %v", name, err)
				}
			}
		}
	}()

	slots := make(chan struct{}, cfg.prefetch)
	var inflight sync.WaitGroup
	var failed error
	var mu sync.Mutex
	take := 0
	nextReclaim := time.Now()
	for {
		if n, err := finished(ctx, rdb, k); err != nil {
			return err
		} else if n {
			break
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			mu.Lock()
			defer mu.Unlock()
			return errors.Join(context.Cause(ctx), failed)
		}
		raw, reclaimed := "", false
		if time.Now().After(nextReclaim) {
			raw, err = reclaim(ctx, rdb, k, name)
			if err != nil {
				return err
			}
			reclaimed = raw != ""
			if !reclaimed {
				nextReclaim = time.Now().Add(cfg.live / 2)
			}
		}
		if !reclaimed {
			raw, err = rdb.BLMove(ctx, k.queue(), k.processing(name), "RIGHT", "LEFT", time.Second).Result()
			if errors.Is(err, redis.Nil) {
				<-slots
				continue
			}
			if err != nil {
				return err
			}
		}
		it, err := parse[item](raw)
		if err != nil {
			return fmt.Errorf("task %q: %w", raw, err)
		}
		take++
		r := run{item: it, Proc: name, Take: take, Reclaimed: reclaimed}
		// One goroutine calls Go in the order the tasks were taken: the
		// Executor runs each key's tasks in that order.
		done := ex.Go(ctx, it.Key, func(ctx context.Context) error { return execute(ctx, rdb, k, cfg, r, raw) })
		inflight.Go(func() {
			defer func() { <-slots }()
			if err := <-done; err != nil {
				// Left in the processing list: it runs again only if this
				// worker dies. The run does not finish, and says why.
				mu.Lock()
				failed = errors.Join(failed, fmt.Errorf("task %d (%s #%d): %w", it.ID, it.Key, it.Seq, err))
				mu.Unlock()
			}
		})
	}
	inflight.Wait()
	if err := ex.Close(); err != nil {
		return err
	}
	st := ex.Stats()
	fmt.Fprintf(out, "%s: ran %d tasks under %d locks, took %d\n", name, st.Tasks, st.Acquisitions, take)
	return failed
}

// finished reports whether every task of the run is done.
func finished(ctx context.Context, rdb *redis.Client, k keys) (bool, error) {
	var total *redis.StringCmd
	var done *redis.IntCmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		total, done = p.Get(ctx, k.total()), p.SCard(ctx, k.done())
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	n, err := total.Int64()
	if err != nil {
		return false, fmt.Errorf("the run's task count: %w", err)
	}
	return done.Val() >= n, nil
}

// reclaim moves one task from the processing list of a worker whose
// liveness key expired into name's, oldest first; LMOVE hands each task to
// one reclaimer only. It returns "" when no dead worker has one left.
func reclaim(ctx context.Context, rdb *redis.Client, k keys, name string) (string, error) {
	ws, err := rdb.SMembers(ctx, k.workers()).Result()
	if err != nil {
		return "", err
	}
	for _, w := range ws {
		if w == name {
			continue
		}
		if n, err := rdb.Exists(ctx, k.alive(w)).Result(); err != nil || n > 0 {
			if err != nil {
				return "", err
			}
			continue
		}
		raw, err := rdb.LMove(ctx, k.processing(w), k.processing(name), "RIGHT", "LEFT").Result()
		if errors.Is(err, redis.Nil) {
			// Nothing left: forget it (a worker that was only slow
			// registers again at its next heartbeat).
			if err := rdb.SRem(ctx, k.workers(), w).Err(); err != nil {
				return "", err
			}
			continue
		}
		return raw, err
	}
	return "", nil
}

// execute is one task: it runs for cfg.work under the key's lock and
// records the run with the lock's fence.
func execute(ctx context.Context, rdb *redis.Client, k keys, cfg config, r run, raw string) error {
	r.Fence = keyed.LockFromContext(ctx).Fence()
	r.Start = stamp()
	if err := rdb.HSet(ctx, k.running(r.Proc), r.ID, jsonOf(r)).Err(); err != nil {
		return err
	}
	select {
	case <-time.After(cfg.work):
	case <-ctx.Done():
		return context.Cause(ctx) // the lock was lost, or the worker stops
	}
	r.End = stamp()
	return record.Run(ctx, rdb,
		[]string{k.fence(r.Key), k.history(), k.done(), k.running(r.Proc), k.processing(r.Proc)},
		fmt.Sprint(r.Fence), jsonOf(r), r.ID, raw).Err()
}

// killed is a run cut by the crash, and what the lock store said after.
type killed struct {
	run
	LastHeld int64 // when the store was last asked and answered that this run's lock was held
}

// result is what the demo saw.
type result struct {
	cfg      config
	t0       int64 // when the producer started
	runs     []run // finished runs, in the order recorded
	killed   []killed
	killedAt int64
	done     int64 // tasks marked done
}

// demo pushes the tasks, starts two workers from bin, SIGKILLs the first
// in the middle of a task, and returns the history once the second has
// finished everything.
func demo(ctx context.Context, bin string, cfg config, out io.Writer) (*result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.run == "" {
		b := make([]byte, 4)
		rand.Read(b)
		cfg.run = hex.EncodeToString(b)
	}
	out = &lockedWriter{w: out} // the workers' output comes on goroutines of exec's
	k := keysOf(cfg.run)
	rdb := newRedis(cfg.run, "demo")
	defer rdb.Close()
	defer cleanup(rdb, k)
	lc, err := locker.Open(ctx, lockURL(), namespace(cfg.run), locker.WithDefaultTTL(cfg.ttl))
	if err != nil {
		return nil, err
	}
	defer lc.Close()
	fmt.Fprintf(out, "run %s: %d keys × %d tasks of %v; locks on %s; tasks on redis %s\n",
		cfg.run, cfg.groups, cfg.tasks, cfg.work, redactedScheme(lockURL()), redisAddr())

	res := &result{cfg: cfg, t0: stamp()}
	// The producer: tasks in submission order, seq by seq across the keys.
	var batch []any
	for seq := 1; seq <= cfg.tasks; seq++ {
		for g := range cfg.groups {
			batch = append(batch, jsonOf(item{ID: len(batch), Key: groupKey(g), Seq: seq}))
		}
	}
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, k.total(), len(batch), 0)
		p.LPush(ctx, k.queue(), batch...) // the first task ends up at the right, where workers pop
		return nil
	}); err != nil {
		return nil, err
	}

	var procs []*exec.Cmd
	for _, w := range []string{"w1", "w2"} {
		cmd := exec.CommandContext(ctx, bin, append([]string{"-worker", w}, cfg.args()...)...)
		lw := &lineWriter{out: out, prefix: "  [" + w + "] "}
		cmd.Stdout, cmd.Stderr = lw, lw
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		procs = append(procs, cmd)
	}
	defer func() {
		for _, p := range procs {
			p.Process.Kill() // an error once it exited
			p.Wait()
		}
	}()

	// Kill w1 in the middle of a task, once a quarter of the tasks are
	// recorded: stop it, and kill it if a task it runs cannot have ended
	// (it started less than a task's time before the stop), else let it go
	// on and look again.
	killBy := time.Now().Add(min(30*time.Second, cfg.timeout))
	for res.killedAt == 0 {
		if time.Now().After(killBy) {
			return nil, errors.New("w1 never ran a task to be killed in")
		}
		time.Sleep(5 * time.Millisecond)
		if n, err := rdb.LLen(ctx, k.history()).Result(); err != nil || n < int64(len(batch)/4) {
			if err != nil {
				return nil, err
			}
			continue
		}
		if err := procs[0].Process.Signal(syscall.SIGSTOP); err != nil {
			return nil, err
		}
		stopped := stamp()
		cur, err := rdb.HGetAll(ctx, k.running("w1")).Result()
		if err != nil {
			return nil, err
		}
		// A margin for the stop to reach every thread of w1.
		const margin = 20 * time.Millisecond
		if slices.ContainsFunc(slices.Collect(maps.Values(cur)), func(s string) bool {
			r, err := parse[run](s)
			return err == nil && r.Start > stopped-int64(cfg.work-margin)
		}) {
			if err := procs[0].Process.Signal(syscall.SIGKILL); err != nil {
				return nil, err
			}
			res.killedAt = stamp()
		} else if err := procs[0].Process.Signal(syscall.SIGCONT); err != nil {
			return nil, err
		}
	}
	procs[0].Wait()
	// What w1 sent before it died may still wait in the server's buffers:
	// read its running tasks once the server has closed its connections.
	if err := closed(ctx, rdb, clientName(cfg.run, "w1")); err != nil {
		return nil, err
	}
	cur, err := rdb.HGetAll(ctx, k.running("w1")).Result()
	if err != nil {
		return nil, err
	}
	for _, s := range cur {
		r, err := parse[run](s)
		if err != nil {
			return nil, err
		}
		res.killed = append(res.killed, killed{run: r})
	}
	if len(res.killed) == 0 {
		return nil, errors.New("w1 was killed between two tasks")
	}
	fmt.Fprintf(out, "killed w1 at +%v, in the middle of %d task(s)\n", since(res.t0, res.killedAt), len(res.killed))

	// Watch the killed runs' locks until the store frees them (TTL, lease
	// or session expiry).
	wait := 3*cfg.ttl + 10*time.Second
	freeBy := time.Now().Add(wait)
	free := make([]bool, len(res.killed))
	for slices.Contains(free, false) {
		if time.Now().After(freeBy) {
			return nil, fmt.Errorf("the killed worker's locks were still held %v after the kill", wait)
		}
		for i := range res.killed {
			kr := &res.killed[i]
			if free[i] {
				continue
			}
			asked := stamp()
			st, err := lc.Inspect(ctx, kr.Key)
			if err != nil {
				return nil, err
			}
			if st.Held && st.Fence == kr.Fence {
				kr.LastHeld = asked
				continue
			}
			free[i] = true
			if kr.LastHeld == 0 {
				fmt.Fprintf(out, "w1's lock of %s (fence %d): free at the first look\n", kr.Key, kr.Fence)
			} else {
				fmt.Fprintf(out, "w1's lock of %s (fence %d): seen held until +%v, then free\n", kr.Key, kr.Fence, since(res.t0, kr.LastHeld))
			}
		}
		time.Sleep(10 * time.Millisecond)
	}

	if err := procs[1].Wait(); err != nil {
		return nil, fmt.Errorf("w2: %w", err)
	}

	raws, err := rdb.LRange(ctx, k.history(), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	for _, s := range raws {
		r, err := parse[run](s)
		if err != nil {
			return nil, err
		}
		res.runs = append(res.runs, r)
	}
	if res.done, err = rdb.SCard(ctx, k.done()).Result(); err != nil {
		return nil, err
	}
	report(res, out)
	return res, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// lineWriter writes a child's output line by line, each with its prefix.
// exec calls it from one goroutine, as Stdout and Stderr are the same.
type lineWriter struct {
	out    io.Writer
	prefix string
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		fmt.Fprintf(w.out, "%s%s\n", w.prefix, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

// redactedScheme names the lock store without its address or secrets.
func redactedScheme(u string) string {
	s, _, _ := strings.Cut(u, "://")
	if strings.Contains(u, "fair=true") {
		s += " (fair=true)"
	}
	return s
}

// cleanup removes the run's keys.
func cleanup(rdb *redis.Client, k keys) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, string(k)+"*", 100).Iterator()
	var all []string
	for iter.Next(ctx) {
		all = append(all, iter.Val())
	}
	if len(all) > 0 {
		rdb.Del(ctx, all...)
	}
}

// checkReport is what check found.
type checkReport struct {
	problems   []string
	resumed    []string // how each killed run was resumed
	inversions int      // adjacent runs of a key, by start, whose seqs go down
	pairs      int
	repeats    int // finished runs beyond one per task
	grants     int // distinct (key, fence): lock grants that ran tasks
}

// check verifies the history against what keyed promises on every backend:
//   - exclusion: no two runs of a key overlap; a killed run lasts until the
//     store was last seen holding its lock;
//   - fences: along a key's runs in start order the fence never goes down,
//     and goes up whenever the process changes (a new grant);
//   - order within a process: a process runs a key's tasks in the order it
//     took them (its Go calls), so the ones it popped from the queue in
//     submission order;
//   - every task finished at least once;
//   - every killed run was resumed by another process, after the store was
//     last seen holding the killed run's lock, under a higher fence.
//
// Order across processes is counted, not checked: a worker pops a task and
// then asks for its lock, and the other worker can ask first; a fair store
// grants batches in the order the processes asked, which is not the order
// of the queue.
func check(res *result) checkReport {
	var rep checkReport
	bad := func(format string, a ...any) { rep.problems = append(rep.problems, fmt.Sprintf(format, a...)) }
	byKey := map[string][]run{}
	for _, r := range res.runs {
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	for _, kr := range res.killed {
		r := kr.run
		r.End = kr.LastHeld
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	grants := map[string]bool{}
	for key, rs := range byKey {
		slices.SortFunc(rs, func(a, b run) int { return cmp.Compare(a.Start, b.Start) })
		var lastEnd int64
		for i, r := range rs {
			grants[fmt.Sprint(key, r.Fence)] = true
			if i == 0 {
				lastEnd = r.End
				continue
			}
			p := rs[i-1]
			if r.Start <= lastEnd {
				bad("%s: task #%d (%s) started %v before an earlier run ended", key, r.Seq, r.Proc, time.Duration(lastEnd-r.Start))
			}
			lastEnd = max(lastEnd, r.End)
			if r.Fence < p.Fence || (r.Proc != p.Proc && r.Fence == p.Fence) {
				bad("%s: fence %d (%s) after %d (%s)", key, r.Fence, r.Proc, p.Fence, p.Proc)
			}
		}
		// Within each process: take order, and queue order for popped tasks.
		for _, proc := range []string{"w1", "w2"} {
			var lastTake, lastSeq int
			for _, r := range rs {
				if r.Proc != proc {
					continue
				}
				if r.Take <= lastTake {
					bad("%s on %s: take %d ran after take %d", key, proc, r.Take, lastTake)
				}
				lastTake = r.Take
				if !r.Reclaimed {
					if r.Seq <= lastSeq {
						bad("%s on %s: popped task #%d ran after #%d", key, proc, r.Seq, lastSeq)
					}
					lastSeq = r.Seq
				}
			}
		}
	}
	rep.grants = len(grants)
	for _, rs := range byKey {
		// Finished runs only: a killed run's End is its lock's.
		rs = slices.DeleteFunc(slices.Clone(rs), func(r run) bool {
			return slices.ContainsFunc(res.killed, func(k killed) bool { return k.Proc == r.Proc && k.Start == r.Start })
		})
		for i := 1; i < len(rs); i++ {
			rep.pairs++
			if rs[i].Seq < rs[i-1].Seq {
				rep.inversions++
			}
		}
	}

	ran := map[int]int{}
	for _, r := range res.runs {
		ran[r.ID]++
	}
	total := res.cfg.groups * res.cfg.tasks
	for id := range total {
		if ran[id] == 0 {
			bad("task %d never finished", id)
		}
	}
	rep.repeats = len(res.runs) - len(ran)
	if res.done != int64(total) {
		bad("%d tasks marked done, want %d", res.done, total)
	}

	for _, kr := range res.killed {
		if kr.LastHeld < res.killedAt {
			bad("%s: the killed run's lock (fence %d) was never seen held after the kill", kr.Key, kr.Fence)
		}
		i := slices.IndexFunc(res.runs, func(r run) bool {
			return r.ID == kr.ID && r.Proc != kr.Proc && r.Start > kr.LastHeld && r.Fence > kr.Fence
		})
		if i < 0 {
			bad("%s #%d, killed on %s: not resumed by another process after its lock was freed", kr.Key, kr.Seq, kr.Proc)
			continue
		}
		r := res.runs[i]
		rep.resumed = append(rep.resumed, fmt.Sprintf("%s #%d: killed on %s at fence %d, resumed on %s at +%v, fence %d, %v after the lock was last seen held",
			kr.Key, kr.Seq, kr.Proc, kr.Fence, r.Proc, since(res.t0, r.Start), r.Fence, time.Duration(r.Start-kr.LastHeld).Round(time.Millisecond)))
	}
	return rep
}

// report prints each key's runs in start order ("3a": task #3 on w1, "x":
// killed, "r": reclaimed), then what check found.
func report(res *result, out io.Writer) {
	byKey := map[string][]run{}
	for _, r := range res.runs {
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	for _, kr := range res.killed {
		byKey[kr.Key] = append(byKey[kr.Key], kr.run)
	}
	var ks []string
	for key := range byKey {
		ks = append(ks, key)
	}
	slices.Sort(ks)
	for _, key := range ks {
		rs := byKey[key]
		slices.SortFunc(rs, func(a, b run) int { return cmp.Compare(a.Start, b.Start) })
		var b bytes.Buffer
		for _, r := range rs {
			fmt.Fprintf(&b, " %d%s", r.Seq, map[string]string{"w1": "a", "w2": "b"}[r.Proc])
			if r.End == 0 {
				b.WriteString("x")
			}
			if r.Reclaimed {
				b.WriteString("r")
			}
		}
		fmt.Fprintf(out, "%-18s%s\n", key, b.String())
	}
	rep := check(res)
	for _, s := range rep.resumed {
		fmt.Fprintln(out, "resumed:", s)
	}
	fmt.Fprintf(out, "%d runs finished (%d repeated), %d tasks done, %d lock grants; %d of %d adjacent runs of a key out of submission order across processes (not promised)\n",
		len(res.runs), rep.repeats, res.done, rep.grants, rep.inversions, rep.pairs)
	if len(rep.problems) == 0 {
		fmt.Fprintln(out, "ok: no overlap per key, fences increase, each process kept its order, every task done, the killed task resumed after its lock was freed")
	}
	for _, p := range rep.problems {
		fmt.Fprintln(out, "FAIL:", p)
	}
}
