package election_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/election"
	"github.com/lockerhq/locker/internal/testutil"
)

// TestObserveFollowsNotifications: where the backend reports releases, a
// resignation and the successor's term reach an observer long before its
// poll interval (a minute here) would have.
func TestObserveFollowsNotifications(t *testing.T) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			ns := "election-watch-" + testutil.RandHex(4)
			obs, _ := open(t, tg, ns, false)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, stop, err := obs.Watch(ctx, "leader"); errors.Is(err, locker.ErrUnsupported) {
				t.Skip("the backend reports no releases: Observe polls")
			} else if err != nil {
				t.Fatal(err)
			} else {
				stop()
			}
			var cands []*election.Election
			for i := range 2 {
				c, _ := open(t, tg, ns, false)
				e, err := election.New(c, "leader", election.Value(string(rune('a'+i))))
				if err != nil {
					t.Fatal(err)
				}
				cands = append(cands, e)
			}
			oe, err := election.New(obs, "leader", election.PollEvery(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			feed, err := oe.Observe(ctx)
			if err != nil {
				t.Fatal(err)
			}
			next := func(what string) election.Leader {
				t.Helper()
				select {
				case l := <-feed:
					return l
				case <-time.After(5 * time.Second):
					t.Fatalf("%s: nothing observed within 5 s (the poll interval is a minute)", what)
				}
				return election.Leader{}
			}
			if l := next("the first state"); l.Held {
				t.Fatalf("first state %+v, want nobody", l)
			}
			first, err := cands[0].Campaign(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// etcd and ZooKeeper report grants; the others only
			// releases, so the first term shows at the handover.
			won := make(chan *election.Term, 1)
			go func() {
				tm, err := cands[1].Campaign(ctx)
				if err != nil {
					t.Error(err)
				}
				won <- tm
			}()
			time.Sleep(200 * time.Millisecond) // the second candidate waits
			resigned := time.Now()
			if err := first.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			var second *election.Term
			select {
			case second = <-won:
			case <-time.After(10 * time.Second):
				t.Fatal("the second candidate did not win within 10 s of the resignation")
			}
			if second == nil {
				return
			}
			defer second.Resign(context.Background())
			for i := 0; ; i++ {
				l := next("after the resignation")
				if l.Held && l.Term == second.Number() {
					t.Logf("the successor's term observed %v after the resignation", time.Since(resigned).Round(time.Millisecond))
					break
				}
				if i > 3 || l.Held && l.Term != first.Number() {
					t.Fatalf("observed %+v, want the first term %d, nobody, then the second %d", l, first.Number(), second.Number())
				}
			}
		})
	}
}
