// Command cron shows a scheduled job that several hosts start and one runs.
// Each "host" (a goroutine with a Client of its own, as a process on
// another machine would have) starts the job at the scheduled time as its
// clock sees it, a little later than the one before: TryDo runs it if the
// lock is free and skips it otherwise, and MinHold keeps the lock held for
// a while after the short job ends, so that a late host finds it held
// rather than free. The job writes its result with the lock's fence, and
// the storage refuses a write whose fence is lower than the last one it
// took, as a database would with a "WHERE fence <= $new" guard: a holder
// that lost its lock (paused, cut off) cannot overwrite a newer result.
//
//	go run ./examples/cron                                  # in-process
//	LOCKER_URL=redis://127.0.0.1:6379/0 go run ./examples/cron
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/lockerhq/locker"
	_ "github.com/lockerhq/locker/etcdlock"
	_ "github.com/lockerhq/locker/filelock"
	_ "github.com/lockerhq/locker/memcachelock"
	_ "github.com/lockerhq/locker/memlock"
	_ "github.com/lockerhq/locker/redislock"
	_ "github.com/lockerhq/locker/sqllock"
	_ "github.com/lockerhq/locker/zklock"
)

// config is the schedule.
type config struct {
	hosts   int
	skew    time.Duration // how much later each host's clock fires than the one before
	minHold time.Duration
	period  time.Duration // between two scheduled runs
	rounds  int
}

func main() {
	var cfg config
	flag.IntVar(&cfg.hosts, "hosts", 4, "how many hosts start the job")
	flag.DurationVar(&cfg.skew, "skew", 100*time.Millisecond, "clock skew between one host and the next")
	flag.DurationVar(&cfg.minHold, "min-hold", 2*time.Second, "keep the lock at least this long: more than the worst skew plus the job's shortest run")
	flag.DurationVar(&cfg.period, "period", 4*time.Second, "time between two scheduled runs")
	flag.IntVar(&cfg.rounds, "rounds", 2, "scheduled runs")
	flag.Parse()
	url := os.Getenv("LOCKER_URL")
	if url == "" {
		url = "mem://cron-example" // one store, shared by the Clients of this process
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := run(ctx, url, cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// storage keeps the job's last result, and takes no write with a fence
// lower than the last one written.
type storage struct {
	mu     sync.Mutex
	fence  uint64
	result string
}

var errStale = errors.New("stale fence")

func (s *storage) write(fence uint64, result string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence < s.fence {
		return fmt.Errorf("%w: %d, after %d", errStale, fence, s.fence)
	}
	s.fence, s.result = fence, result
	return nil
}

// outcome is what one host did in one round.
type outcome struct {
	host  int
	fence uint64 // 0: skipped
	err   error
}

// run runs cfg.rounds scheduled rounds on url and returns, for each, the
// fence of the host that ran the job (0 if none did).
func run(ctx context.Context, url string, cfg config, w io.Writer) ([]uint64, error) {
	clients := make([]*locker.Client, cfg.hosts)
	for i := range clients {
		c, err := locker.Open(ctx, url)
		if err != nil {
			return nil, err
		}
		// Open till the end: on ZooKeeper a lock lives as long as its
		// Client's session, MinHold's remainder included.
		defer c.Close()
		clients[i] = c
	}
	db := &storage{}
	var ran []uint64
	for round := 1; round <= cfg.rounds; round++ {
		scheduled := time.Now()
		outs := make([]outcome, cfg.hosts)
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Go(func() {
				// Clocks drift: which host is first changes from round to round.
				late := (i + round - 1) % cfg.hosts
				time.Sleep(time.Until(scheduled.Add(time.Duration(late) * cfg.skew)))
				outs[i].host = i + 1
				outs[i].err = c.TryDo(ctx, "nightly-report", func(ctx context.Context) error {
					fence := locker.FromContext(ctx).Fence()
					outs[i].fence = fence
					time.Sleep(50 * time.Millisecond) // the job, shorter than the skew
					return db.write(fence, fmt.Sprintf("report of round %d by host %d", round, i+1))
				}, locker.TTL(30*time.Second), locker.MinHold(cfg.minHold))
			})
		}
		wg.Wait()
		var fence uint64
		for _, o := range outs {
			switch {
			case o.err == nil:
				fence = o.fence
				fmt.Fprintf(w, "round %d: host %d ran the job (fence %d)\n", round, o.host, o.fence)
			case errors.Is(o.err, locker.ErrNotAcquired):
				fmt.Fprintf(w, "round %d: host %d skipped: another host ran it\n", round, o.host)
			default:
				return ran, fmt.Errorf("round %d, host %d: %w", round, o.host, o.err)
			}
		}
		ran = append(ran, fence)
		if round < cfg.rounds {
			time.Sleep(time.Until(scheduled.Add(cfg.period)))
		}
	}
	fmt.Fprintf(w, "stored: %q (fence %d)\n", db.result, db.fence)

	// A holder of an earlier round that was paused past its lock and wakes
	// up now: its write is refused.
	if i := slices.IndexFunc(ran, func(f uint64) bool { return f > 0 }); i >= 0 && ran[i] < db.fence {
		err := db.write(ran[i], fmt.Sprintf("late report of round %d", i+1))
		fmt.Fprintf(w, "late write of round %d (fence %d): %v\n", i+1, ran[i], err)
	}
	return ran, nil
}
