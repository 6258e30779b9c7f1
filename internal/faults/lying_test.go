package faults

import (
	"context"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/history"
)

// lyingDriver is a deliberately broken driver: its Refresh reports success
// without touching the store, so the Client believes every refresh and
// never learns that a cut-off lock expired.
type lyingDriver struct{ backend.Driver }

func (lyingDriver) Refresh(context.Context, backend.Claim) error { return nil }

func (lyingDriver) RefreshMany(_ context.Context, ls []backend.Claim) []error {
	return make([]error, len(ls))
}

// TestSuiteCatchesLyingRefresh shows that the suite can fail: with a lying
// refresh, a blackholed holder is never told, another client takes the
// expired lock, and the history checker reports the overlap.
func TestSuiteCatchesLyingRefresh(t *testing.T) {
	var sp spec
	for _, s := range specs() {
		if s.name == "redis" {
			sp = s
		}
	}
	e := newEnv(t, sp, sp.start(t))
	a := e.newClient(func(d backend.Driver) backend.Driver { return lyingDriver{d} })
	b := e.newClient(nil)
	name := uniqueName("lying")
	ha := mustHold(t, a, name)
	ttl := ha.l.TTL()
	t0 := time.Now()
	a.blackhole()
	r := <-waitFor(b, name, 3*ttl+5*time.Second)
	if r.err != nil {
		t.Fatalf("%s: never acquired the expired lock: %v", b.id, r.err)
	}
	// Give an honest Client every chance to have told the holder.
	time.Sleep(lostSlack)
	res := e.rec.Check(history.Options{Allow: func(s history.Snapshot) time.Duration { return backend.ClockMargin(s.TTL) }})
	if res.OK() {
		t.Fatalf("the checker accepted a lying refresh: %s lost at %v, %s acquired at %v",
			a.id, since(t0, ha.lostTime()), b.id, since(t0, r.at))
	}
	if v := res.Violations[0]; v.Kind != history.Overlap || v.First.ID != ha.h.ID {
		t.Fatalf("want an overlap with %s first, got:\n%s", a.id, res.Report())
	}
	t.Logf("caught, as it must be:\n%s", res.Report())
	a.heal()
	r.hd.release(context.Background())
	ha.release(context.Background())
}
