//go:build unix

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker"
)

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
