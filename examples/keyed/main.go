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
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
	_ "github.com/lockerhq/locker/etcdlock"
	_ "github.com/lockerhq/locker/filelock"
	_ "github.com/lockerhq/locker/memcachelock"
	_ "github.com/lockerhq/locker/redislock"
	_ "github.com/lockerhq/locker/sqllock"
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
