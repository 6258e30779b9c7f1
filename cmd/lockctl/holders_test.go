//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker"
)

// TestHolders: status, list and release --force see a semaphore's and a
// read-write lock's holders with --semaphore and --rw, one by one.
func TestHolders(t *testing.T) {
	t.Parallel()
	store, c := memStore(t)
	u := "mem://" + store
	sem := locker.Semaphore(5)
	a := hold(t, c, "pool", sem, locker.Label("worker-a"), locker.TTL(30*time.Second))
	b := hold(t, c, "pool", sem, locker.Permits(2), locker.Label("worker-b"), locker.TTL(30*time.Second))
	hold(t, c, "pool", locker.Label("the-lock")) // another object

	code, out, errs := ctl("status", "--semaphore", "--backend", u, "pool")
	if code != 0 || errs != "" {
		t.Fatalf("status --semaphore: exit %d, stderr %q", code, errs)
	}
	// The time left is shown to the millisecond: 30s, or 29.9xxs once a
	// millisecond has passed since the grant.
	for _, want := range []string{"pool: semaphore, 3 of 5 permits held", fmt.Sprintf(`\n +%d +worker-a +1 permit +(30|29\.\d+)s\n`, a.Fence()), fmt.Sprintf(`\n +%d +worker-b +2 permits +(30|29\.\d+)s\n`, b.Fence())} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("status --semaphore lacks %q:\n%s", want, out)
		}
	}
	_, out, _ = ctl("status", "--semaphore", "--json", "--backend", u, "pool")
	if got := keys(jsonObject(t, out)); !slices.Equal(got, []string{"held", "holders", "limit", "name"}) {
		t.Errorf("status --semaphore --json fields %v, want held, holders, limit, name: %s", got, out)
	}
	var js jsonState
	if err := json.Unmarshal([]byte(out), &js); err != nil || js.Limit == nil || *js.Limit != 5 || len(js.Holders) != 2 ||
		js.Holders[1].Fence != b.Fence() || js.Holders[1].Permits != 2 || js.Holders[1].Owner == nil || *js.Holders[1].Owner != "worker-b" {
		t.Errorf("status --semaphore --json = %s (%v)", out, err)
	}

	r := hold(t, c, "doc", locker.Read(), locker.Label("reader"))
	if _, out, _ := ctl("list", "--rw", "--backend", u); !regexp.MustCompile(fmt.Sprintf(`\ndoc +%d +reader +read +`, r.Fence())).MatchString(out) {
		t.Errorf("list --rw:\n%s", out)
	}
	if _, out, _ := ctl("list", "--semaphore", "--backend", u); strings.Count(out, "\npool ") != 2 {
		t.Errorf("list --semaphore, want a row per holder:\n%s", out)
	}

	// release --force: --fence is required, another fence changes nothing,
	// the right one frees that holder alone.
	if code, _, errs := ctl("release", "--force", "--semaphore", "--backend", u, "pool"); code != exitUsage || !strings.Contains(errs, "need --fence N") {
		t.Errorf("release --semaphore without --fence: exit %d, %q", code, errs)
	}
	if code, out, _ := ctl("release", "--force", "--semaphore", "--fence", fmt.Sprint(b.Fence()+100), "--backend", u, "pool"); code != exitFree || !strings.Contains(out, "nothing changed") {
		t.Errorf("release under another fence: exit %d, %q", code, out)
	}
	code, out, errs = ctl("release", "--force", "--semaphore", "--fence", fmt.Sprint(b.Fence()), "--backend", u, "pool")
	if code != 0 || !strings.Contains(out, `removed the holder of 2 permits with owner "worker-b"`) {
		t.Errorf("release --semaphore --fence: exit %d, %q, %q", code, out, errs)
	}
	if err := b.Refresh(context.Background()); !errors.Is(err, locker.ErrNotHeld) && !errors.Is(err, locker.ErrLost) {
		t.Errorf("the removed holder's Refresh = %v, want the loss", err)
	}
	if err := a.Refresh(context.Background()); err != nil {
		t.Errorf("the other holder's Refresh = %v", err)
	}
	if code, _, errs := ctl("status", "--semaphore", "--rw", "--backend", u, "pool"); code != exitUsage || !strings.Contains(errs, "pick one") {
		t.Errorf("status --semaphore --rw: exit %d, %q", code, errs)
	}
}

// TestResize: lockctl resize lowers a semaphore in use (its holders keep
// their permits), removes the limit with 0, and refuses bad input before
// connecting.
func TestResize(t *testing.T) {
	t.Parallel()
	store, c := memStore(t)
	u := "mem://" + store
	sem := locker.Semaphore(3)
	for range 3 {
		hold(t, c, "pool", sem)
	}
	code, out, errs := ctl("resize", "--backend", u, "pool", "2")
	if code != 0 || errs != "" || !strings.Contains(out, "pool: limit 2, until the next resize") || !strings.Contains(out, "3 of 2 permits held") {
		t.Errorf("resize to 2: exit %d, %q, %q", code, out, errs)
	}
	if _, err := c.TryAcquire(context.Background(), "pool", locker.Semaphore(5)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Errorf("a claim of a semaphore resized below its holders = %v, want ErrNotAcquired", err)
	}
	if code, _, errs := ctl("run", "-n", "--limit", "5", "--backend", u, "pool", "--", "true"); code != exitNotAcquired || !strings.Contains(errs, `all 2 permits (lockctl resize set it) of "pool"`) {
		t.Errorf("run -n of a full resized semaphore: exit %d, %q", code, errs)
	}
	if code, out, _ := ctl("resize", "--backend", u, "pool", "0"); code != 0 || !strings.Contains(out, "removed") {
		t.Errorf("resize to 0: exit %d, %q", code, out)
	}
	if code, out, _ := ctl("resize", "--backend", u, "idle", "4"); code != 0 || !strings.Contains(out, "idle: semaphore, free, limit 4") {
		t.Errorf("resize of a free semaphore: exit %d, %q", code, out)
	}
	if _, out, _ := ctl("status", "--semaphore", "--json", "--backend", u, "idle"); !strings.Contains(out, `"limit":4`) {
		t.Errorf("status --json of a free resized semaphore: %q", out)
	}
	for _, args := range [][]string{{"pool"}, {"pool", "-1"}, {"pool", "10001"}, {"pool", "x"}, {"a\x00b", "2"}} {
		code, out, errs := ctl(append([]string{"resize", "--backend", "redis://127.0.0.1:1/0"}, args...)...)
		if code != exitUsage || out != "" {
			t.Errorf("resize %q: exit %d, stdout %q; want %d", args, code, out, exitUsage)
		}
		oneLine(t, fmt.Sprintf("resize %q", args), errs, "resize")
	}
	code, _, errs = ctl("resize", "--backend", "memplain://"+store, "pool", "2")
	if code != exitUsage {
		t.Errorf("resize on a backend without Resize: exit %d", code)
	}
	oneLine(t, "resize without Resize", errs, "cannot keep a semaphore's limit")
}
